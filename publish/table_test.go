package publish

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// tableSize refuses exactly the values amqp091 cannot encode, and the keys
// it cannot, naming where they are.
func TestTableSizeRefusesWhatAMQP091Cannot(t *testing.T) {
	t.Parallel()
	for _, v := range []any{
		nil, true, byte(1), int8(1), int16(1), uint16(1), 1, int32(1), uint32(1), int64(1),
		float32(1), 1.0, time.Now(), amqp.Decimal{}, "s", []byte("b"), []any{1, "x"}, amqp.Table{"a": 1},
		uint64(1), uint(1), map[string]any{"a": 1}, []string{"x"}, []int{1}, struct{}{}, new(int),
		[]any{uint64(1)}, amqp.Table{"a": []any{amqp.Table{"b": uint(1)}}},
	} {
		_, err := tableSize(amqp.Table{"k": v})
		want := amqp.Table{"k": v}.Validate()
		require.Equal(t, want == nil, err == nil, "%T %v: %v", v, v, err)
	}

	_, err := tableSize(amqp.Table{"a": []any{"x", amqp.Table{"b": uint64(7)}}})
	require.EqualError(t, err, `key "a": element 1: key "b": uint64 not supported`)
	_, err = tableSize(amqp.Table{"a": amqp.Table{strings.Repeat("k", 256): 1}})
	require.EqualError(t, err, `key "a": key "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk"… is 256 bytes, more than 255`)

	n, err := tableSize(amqp.Table{"a": "bc"})
	require.NoError(t, err)
	require.Equal(t, 4+(1+1)+(1+4+2), n)
}
