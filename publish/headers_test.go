package publish

import (
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

func TestHeadersFromJSON(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		raw     string
		want    amqp.Table
		invalid bool
	}{
		{name: "nil", raw: ""},
		{name: "blank", raw: " \n\t"},
		{name: "null", raw: "null"},
		{name: "empty object", raw: "{}", want: amqp.Table{}},
		{name: "string", raw: `{"s":"héllo"}`, want: amqp.Table{"s": "héllo"}},
		{name: "bools", raw: `{"t":true,"f":false}`, want: amqp.Table{"t": true, "f": false}},
		{name: "null value", raw: `{"n":null}`, want: amqp.Table{"n": nil}},
		{name: "integers", raw: `{"a":0,"b":-7,"c":9223372036854775807,"d":-9223372036854775808}`,
			want: amqp.Table{"a": int64(0), "b": int64(-7), "c": int64(9223372036854775807), "d": int64(-9223372036854775808)}},
		{name: "integral floats", raw: `{"a":2.0,"b":1e3,"c":-0.0}`, want: amqp.Table{"a": int64(2), "b": int64(1000), "c": int64(0)}},
		{name: "floats", raw: `{"a":1.5,"b":-2.25e-3,"c":9223372036854775808,"d":1e300}`,
			want: amqp.Table{"a": 1.5, "b": -2.25e-3, "c": 9223372036854775808.0, "d": 1e300}},
		{name: "nested object", raw: `{"o":{"p":{"q":1}}}`, want: amqp.Table{"o": amqp.Table{"p": amqp.Table{"q": int64(1)}}}},
		{name: "array", raw: `{"a":[1,"x",true,null,1.5,{"k":"v"},[2]]}`,
			want: amqp.Table{"a": []any{int64(1), "x", true, nil, 1.5, amqp.Table{"k": "v"}, []any{int64(2)}}}},
		{name: "empty array", raw: `{"a":[]}`, want: amqp.Table{"a": []any{}}},
		{name: "top-level array", raw: `[1,2]`, invalid: true},
		{name: "top-level string", raw: `"s"`, invalid: true},
		{name: "top-level number", raw: `42`, invalid: true},
		{name: "top-level bool", raw: `true`, invalid: true},
		{name: "malformed", raw: `{"a":`, invalid: true},
		{name: "trailing data", raw: `{"a":1} {"b":2}`, invalid: true},
		{name: "number out of range", raw: `{"a":1e400}`, invalid: true},
		{name: "key too long", raw: `{"` + strings.Repeat("k", 256) + `":1}`, invalid: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := HeadersFromJSON([]byte(tc.raw))
			if tc.invalid {
				require.ErrorIs(t, err, ErrInvalid)
				require.Nil(t, got)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			require.NoError(t, got.Validate(), "every result is publishable")
		})
	}
}

// Each layer names itself once: the relay wraps these as "event 7 headers:
// …", so they name the key and element, never the headers again.
func TestHeadersFromJSONErrorText(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		`[1, 2]`:                      `publish: invalid message: an array, not a JSON object`,
		`{"a":`:                       `publish: invalid message: JSON: unexpected EOF`,
		`{"a":1} {"b":2}`:             `publish: invalid message: JSON: data after the value`,
		`{"o":{"a":[1,{"n":1e400}]}}`: `publish: invalid message: key "o": key "a": element 1: key "n": number 1e400: strconv.ParseFloat: parsing "1e400": value out of range`,
		`{"o":{"` + strings.Repeat("k", 256) + `":1}}`: `publish: invalid message: key "o": key "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk"… is 256 bytes, more than 255`,
	} {
		_, err := HeadersFromJSON([]byte(raw))
		require.ErrorIs(t, err, ErrInvalid)
		require.EqualError(t, err, want)
	}
}
