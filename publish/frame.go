package publish

import (
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The content header frame carries a message's properties, its headers
// among them. amqp091 splits a body into as many body frames as it needs,
// but writes the content header as one frame, whatever its size; RabbitMQ
// answers a frame larger than the connection's negotiated frame_max by
// closing the whole connection (FRAME_ERROR, frame_too_large), which fails
// every batch in flight on it, on every attempt. Such a message is invalid
// and refused before it is sent.
const (
	// frameOverhead is a frame's header (type 1, channel 2, payload size
	// 4) and its frame-end octet.
	frameOverhead = 7 + 1
	// contentHeaderFixed is the start of a content header's payload: class
	// id 2, weight 2, body size 8, property flags 2.
	contentHeaderFixed = 2 + 2 + 8 + 2
)

// headerFrameSize returns the size in bytes of the content header frame
// amqp091 writes for pub (its writeFrame of a headerFrame): the frame
// overhead, the fixed part of the payload, then each property amqp091
// sends, which are those that are not zero (short strings take a length
// byte and their bytes; delivery mode and priority 1 byte; the timestamp 8;
// headers, when the table is not empty, their encoding as a field table).
// pub must be valid (m.validate). It is the exact size, byte for byte what
// RabbitMQ counts (TestHeaderFrameSizeIsWhatRabbitMQCounts).
func headerFrameSize(pub *amqp.Publishing) int {
	n := frameOverhead + contentHeaderFixed
	for _, s := range []string{
		pub.ContentType, pub.ContentEncoding, pub.CorrelationId, pub.ReplyTo,
		pub.Expiration, pub.MessageId, pub.Type, pub.UserId, pub.AppId,
	} {
		if s != "" {
			n += 1 + len(s)
		}
	}
	if pub.DeliveryMode > 0 {
		n++
	}
	if pub.Priority > 0 {
		n++
	}
	if !pub.Timestamp.IsZero() {
		n += 8
	}
	if len(pub.Headers) > 0 {
		size, _ := tableSize(pub.Headers) // validated
		n += size
	}
	return n
}

// checkHeaderFrame fails, wrapping ErrInvalid, if pub's content header
// frame would not fit in one frame of frameSize bytes, the connection's
// negotiated frame_max (0: no limit). The bound is the specification's: a
// whole frame, overhead included, of at most frame_max bytes. RabbitMQ
// tolerates 8 bytes more (it refuses a payload over frame_max, reporting
// it against frame_max - 8), so the check is conservative by exactly 8
// bytes, and never lets a frame_too_large through.
func checkHeaderFrame(pub *amqp.Publishing, frameSize int) error {
	if frameSize <= 0 {
		return nil
	}
	size := headerFrameSize(pub)
	if size <= frameSize {
		return nil
	}
	headers := 0
	if len(pub.Headers) > 0 {
		headers, _ = tableSize(pub.Headers)
	}
	return fmt.Errorf("%w: headers: %d bytes encoded make a content header frame of %d bytes, more than the connection's frame size of %d",
		ErrInvalid, headers, size, frameSize)
}
