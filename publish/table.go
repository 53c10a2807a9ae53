package publish

import (
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// tableSize returns how many bytes t takes on the wire as an AMQP 0-9-1
// field table, as amqp091 encodes it: a 4-byte length, then per field its
// key as a short string (1-byte length and the bytes) and its value
// (fieldSize). It fails if amqp091 could not encode t: a value of a type it
// cannot write, or a key over 255 bytes, at any depth. Such a message must
// never reach amqp091, as an encoding error mid-frame tears down the whole
// connection.
func tableSize(t amqp.Table) (int, error) {
	n := 4
	for k, v := range t {
		if len(k) > maxShortString {
			return 0, fmt.Errorf("key %.32q… is %d bytes, more than %d", k, len(k), maxShortString)
		}
		size, err := fieldSize(v)
		if err != nil {
			return 0, fmt.Errorf("key %q: %w", k, err)
		}
		n += 1 + len(k) + size
	}
	return n, nil
}

// fieldSize returns the size of one field value: a type byte, then the
// value. The types are exactly those amqp091's writeField accepts (and
// Table.Validate), each with the width it writes; note that amqp091 writes
// an int as 4 bytes, like an int32.
func fieldSize(v any) (int, error) {
	switch v := v.(type) {
	case nil:
		return 1, nil
	case bool, byte, int8:
		return 1 + 1, nil
	case int16, uint16:
		return 1 + 2, nil
	case int, int32, uint32, float32:
		return 1 + 4, nil
	case int64, float64, time.Time:
		return 1 + 8, nil
	case amqp.Decimal:
		return 1 + 1 + 4, nil // scale, value
	case string:
		return 1 + 4 + len(v), nil
	case []byte:
		return 1 + 4 + len(v), nil
	case []any:
		n := 1 + 4
		for i, e := range v {
			size, err := fieldSize(e)
			if err != nil {
				return 0, fmt.Errorf("element %d: %w", i, err)
			}
			n += size
		}
		return n, nil
	case amqp.Table:
		n, err := tableSize(v)
		return 1 + n, err
	default:
		return 0, fmt.Errorf("%T not supported", v)
	}
}
