package publish_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/outbox"
	"github.com/outboxrelay/outboxrelay/publish"
)

// The producer library (the module github.com/outboxrelay/outboxrelay/outbox)
// refuses exactly the headers the relay would dead-letter: the same cases go
// to its Event.Validate and, as the JSON the library stores, to the relay's
// publish.HeadersFromJSON. The library does not import the relay, so the
// test lives here.
func TestHeadersAgreeWithTheRelay(t *testing.T) {
	t.Parallel()
	key255, key256 := strings.Repeat("k", 255), strings.Repeat("k", 256)
	for _, tc := range []struct {
		name    string
		headers map[string]any
		ok      bool
	}{
		{"none", nil, true},
		{"empty", map[string]any{}, true},
		{"scalars", map[string]any{"s": "x", "t": true, "f": false, "nil": nil, "i": 42, "neg": -7, "float": 2.5, "u": uint64(1 << 63)}, true},
		{"empty key", map[string]any{"": "x"}, true},
		{"key of 255 bytes", map[string]any{key255: 1}, true},
		{"key of 256 bytes", map[string]any{key256: 1}, false},
		{"multi-byte key over 255 bytes", map[string]any{strings.Repeat("é", 128): 1}, false},
		{"nested map", map[string]any{"m": map[string]any{"a": []any{1, "two", map[string]any{"b": nil}}}}, true},
		{"nested long key", map[string]any{"m": map[string]any{key256: 1}}, false},
		{"long key in an array", map[string]any{"a": []any{[]any{map[string]any{key256: true}}}}, false},
		{"long value", map[string]any{"v": strings.Repeat("v", 100000)}, true},
		{"typed slices and structs", map[string]any{"ints": []int{1, 2}, "struct": struct{ A string }{"x"}}, true},
		{"largest float", map[string]any{"n": 1.7976931348623157e308}, true},
		{"huge integer", map[string]any{"n": json.Number("123456789012345678901234567890")}, true},
		{"number beyond float64", map[string]any{"n": json.Number("1e400")}, false},
		{"negative number beyond float64", map[string]any{"n": json.RawMessage("-1e400")}, false},
		{"nested number beyond float64", map[string]any{"a": []any{json.Number("2e308")}}, false},
		{"tiny number", map[string]any{"n": json.Number("1e-400")}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := json.Marshal(tc.headers)
			require.NoError(t, err)
			_, relayErr := publish.HeadersFromJSON(raw)
			libErr := outbox.Event{AggregateType: "a", AggregateID: "1", EventType: "e", Payload: 1, Headers: tc.headers}.Validate()
			if tc.ok {
				require.NoError(t, relayErr, "the relay")
				require.NoError(t, libErr, "the library")
			} else {
				require.ErrorIs(t, relayErr, publish.ErrInvalid, "the relay")
				require.ErrorIs(t, libErr, outbox.ErrInvalidEvent, "the library")
				require.ErrorContains(t, libErr, "Headers: ")
			}
		})
	}
}
