package outbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
)

// encodeHeaders returns the JSON object of the event's headers with the
// trace context headers added (unless the event has a traceparent of its
// own), or nil when there are none. The caller's map is never modified.
func encodeHeaders(h map[string]any, trace map[string]string) ([]byte, error) {
	if _, own := h[headerTraceparent]; own {
		trace = nil
	}
	if len(h) == 0 && len(trace) == 0 {
		return nil, nil
	}
	if len(trace) > 0 {
		h = maps.Clone(h)
		if h == nil {
			h = make(map[string]any, len(trace))
		}
		for k, v := range trace {
			h[k] = v
		}
	}
	b, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	if err := checkHeaders(b); err != nil {
		return nil, err
	}
	if err := checkJSONText(b); err != nil {
		return nil, err
	}
	return b, nil
}

// checkHeaders applies the relay's rules for a headers column (those of
// publish.HeadersFromJSON, which this package does not import; the relay's
// publish/outbox_headers_test.go feeds both the same cases): keys of at most
// 255 bytes at any depth, and numbers a float64 can hold. Anything else JSON
// can say, AMQP can carry.
func checkHeaders(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return err
	}
	return checkHeaderValue(v)
}

func checkHeaderValue(v any) error {
	switch v := v.(type) {
	case map[string]any:
		for k, f := range v {
			if len(k) > maxShortString {
				return fmt.Errorf("key %.32q… is %d bytes, more than %d", k, len(k), maxShortString)
			}
			if err := checkHeaderValue(f); err != nil {
				return fmt.Errorf("field %q: %w", k, err)
			}
		}
	case []any:
		for i, e := range v {
			if err := checkHeaderValue(e); err != nil {
				return fmt.Errorf("element %d: %w", i, err)
			}
		}
	case json.Number:
		if _, err := strconv.ParseInt(string(v), 10, 64); err == nil {
			return nil
		}
		if _, err := strconv.ParseFloat(string(v), 64); err != nil {
			return fmt.Errorf("number %s: %w", v, err)
		}
	}
	return nil
}
