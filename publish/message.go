package publish

import (
	"cmp"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Errors a message's result may wrap. Any other error (connection or channel
// loss, confirm timeout, not connected) is transient: the same message may
// succeed later.
var (
	// ErrInvalid: the message can never be published as it is (body over
	// MaxMessageSize, exchange, routing key, message id, type or a header
	// key over 255 bytes, a header value AMQP cannot carry, headers too
	// large for one frame of the connection's negotiated frame size).
	ErrInvalid = errors.New("publish: invalid message")
	// ErrReturned: the broker returned the message as unroutable (no queue
	// bound for its routing key). The error carries the reply code and text.
	ErrReturned = errors.New("publish: returned by broker")
	// ErrNacked: the broker refused the message (basic.nack), for instance a
	// full queue with overflow=reject-publish.
	ErrNacked = errors.New("publish: nacked by broker")
	// ErrExchangeNotFound: the message's own exchange does not exist.
	ErrExchangeNotFound = errors.New("publish: exchange not found")
	// ErrNotConnected: Publish was called while the connection was down or
	// blocked by a broker resource alarm; call WaitReady first.
	ErrNotConnected = errors.New("publish: not connected")
	// ErrClosed: the publisher was closed (Close, or Run returned).
	ErrClosed = errors.New("publish: publisher closed")
)

// Content types the publisher sends when a Message names none.
const (
	// ContentTypeJSON is a Message's default content-type.
	ContentTypeJSON = "application/json"
	// ContentTypeBytes is the content-type of a body that is not JSON and
	// says nothing more of itself.
	ContentTypeBytes = "application/octet-stream"
)

// Message is one AMQP message. The publisher sends it persistent and
// mandatory.
type Message struct {
	// Exchange is where it goes; "" means Config.Exchange.
	Exchange string
	// RoutingKey is matched against the exchange's bindings. A message no
	// binding matches fails with ErrReturned.
	RoutingKey string
	// MessageID is the stable id consumers drop duplicates by; it also
	// matches returned messages to the batch, so it should be unique within
	// a batch.
	MessageID string
	// Type is the AMQP type property (the event type).
	Type string
	// Timestamp is the AMQP timestamp property (second precision on the
	// wire).
	Timestamp time.Time
	// Headers are the AMQP headers; see HeadersFromJSON. With the other
	// properties they must fit in one AMQP frame of the size the connection
	// negotiated (RabbitMQ's frame_max, 128 KiB by default).
	Headers amqp.Table
	// Body is the payload, sent as it is.
	Body []byte
	// ContentType is the AMQP content-type property; "" sends
	// ContentTypeJSON.
	ContentType string
}

// validate reports why m can never be published, wrapping ErrInvalid; the
// exchange is the resolved one. Anything amqp091 would fail to encode is
// caught here: an encoding error mid-frame tears down the whole connection.
// The one limit it cannot check is the connection's frame size, which the
// headers must fit in: see checkHeaderFrame.
func (m *Message) validate(exchange string, maxBody int) error {
	switch {
	case len(m.Body) > maxBody:
		return fmt.Errorf("%w: body is %d bytes, more than MaxMessageSize %d", ErrInvalid, len(m.Body), maxBody)
	case len(exchange) > maxShortString:
		return fmt.Errorf("%w: exchange is %d bytes, more than %d", ErrInvalid, len(exchange), maxShortString)
	case len(m.RoutingKey) > maxShortString:
		return fmt.Errorf("%w: routing key is %d bytes, more than %d", ErrInvalid, len(m.RoutingKey), maxShortString)
	case len(m.MessageID) > maxShortString:
		return fmt.Errorf("%w: message id is %d bytes, more than %d", ErrInvalid, len(m.MessageID), maxShortString)
	case len(m.Type) > maxShortString:
		return fmt.Errorf("%w: type is %d bytes, more than %d", ErrInvalid, len(m.Type), maxShortString)
	case len(m.ContentType) > maxShortString:
		return fmt.Errorf("%w: content type is %d bytes, more than %d", ErrInvalid, len(m.ContentType), maxShortString)
	}
	if _, err := tableSize(m.Headers); err != nil {
		return fmt.Errorf("%w: headers: %w", ErrInvalid, err)
	}
	return nil
}

// publishing is the AMQP message sent for m.
func (m *Message) publishing() amqp.Publishing {
	return amqp.Publishing{
		Headers:      m.Headers,
		ContentType:  cmp.Or(m.ContentType, ContentTypeJSON),
		DeliveryMode: amqp.Persistent,
		MessageId:    m.MessageID,
		Timestamp:    m.Timestamp,
		Type:         m.Type,
		Body:         m.Body,
	}
}
