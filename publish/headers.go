package publish

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"

	amqp "github.com/rabbitmq/amqp091-go"
)

// HeadersFromJSON converts a JSON object (an outbox row's headers column)
// into AMQP headers. Empty input, whitespace or JSON null give a nil table.
// Strings, booleans and null map to themselves; numbers become int64 when
// they are integral and fit, float64 otherwise; nested objects become
// amqp.Table and arrays []any, recursively. Anything that is not a JSON
// object, or is not valid JSON, gives an error wrapping ErrInvalid. The
// error names the key and element where the problem is, not the headers
// themselves: the caller says what it converted ("event 7 headers: …").
func HeadersFromJSON(raw []byte) (amqp.Table, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: JSON: %w", ErrInvalid, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: JSON: data after the value", ErrInvalid)
	}
	switch obj := v.(type) {
	case nil:
		return nil, nil
	case map[string]any:
		t, err := jsonTable(obj)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		return t, nil
	default:
		return nil, fmt.Errorf("%w: %s, not a JSON object", ErrInvalid, jsonKind(v))
	}
}

func jsonTable(obj map[string]any) (amqp.Table, error) {
	t := make(amqp.Table, len(obj))
	for k, v := range obj {
		if len(k) > maxShortString {
			return nil, fmt.Errorf("key %.32q… is %d bytes, more than %d", k, len(k), maxShortString)
		}
		f, err := jsonField(v)
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", k, err)
		}
		t[k] = f
	}
	return t, nil
}

func jsonField(v any) (any, error) {
	switch v := v.(type) {
	case nil, bool, string:
		return v, nil
	case json.Number:
		return jsonNumber(v)
	case map[string]any:
		return jsonTable(v)
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			f, err := jsonField(e)
			if err != nil {
				return nil, fmt.Errorf("element %d: %w", i, err)
			}
			out[i] = f
		}
		return out, nil
	default:
		// encoding/json with UseNumber produces nothing else.
		panic(fmt.Sprintf("publish: unexpected JSON value %T", v))
	}
}

// jsonNumber is int64 for integral values within int64's range (42, 1e3,
// 2.0), float64 for the rest.
func jsonNumber(n json.Number) (any, error) {
	if i, err := strconv.ParseInt(string(n), 10, 64); err == nil {
		return i, nil
	}
	f, err := strconv.ParseFloat(string(n), 64)
	if err != nil {
		return nil, fmt.Errorf("number %s: %w", n, err)
	}
	// -2^63 is exact in float64; 2^63 is not an int64.
	if f == math.Trunc(f) && f >= math.MinInt64 && f < math.MaxInt64 {
		return int64(f), nil
	}
	return f, nil
}

func jsonKind(v any) string {
	switch v.(type) {
	case []any:
		return "an array"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	default:
		return fmt.Sprintf("%T", v)
	}
}
