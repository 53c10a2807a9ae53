package relay

import (
	"fmt"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/publish"
)

// Header names the relay sets on every message, besides the row's own
// headers, which they override.
const (
	HeaderAggregateType = "aggregate_type"
	HeaderAggregateID   = "aggregate_id"
)

// Message maps an outbox row to the AMQP message the relay publishes: the
// row's exchange (or the publisher's default), its routing key (or
// "<aggregate_type>.<event_type>"), event_id as MessageId, event_type as
// Type, created_at as Timestamp, payload as the body (or payload_bytes, as
// they are, when the row has them), content_type as ContentType (default
// application/json, or application/octet-stream for payload_bytes), and
// the row's headers plus aggregate_type and aggregate_id as AMQP headers. A row whose headers
// are not a JSON object gives an error wrapping publish.ErrInvalid.
func Message(e claim.Event) (publish.Message, error) {
	headers, err := publish.HeadersFromJSON(e.Headers)
	if err != nil {
		return publish.Message{}, fmt.Errorf("event %d headers: %w", e.ID, err)
	}
	if headers == nil {
		headers = make(map[string]any, 2)
	}
	headers[HeaderAggregateType] = e.AggregateType
	headers[HeaderAggregateID] = e.AggregateID
	key := e.RoutingKey
	if key == "" {
		key = e.AggregateType + "." + e.EventType
	}
	body, contentType := e.Payload, e.ContentType
	if e.PayloadBytes != nil {
		body = e.PayloadBytes
		if contentType == "" {
			contentType = publish.ContentTypeBytes
		}
	}
	return publish.Message{
		Exchange:    e.Exchange,
		RoutingKey:  key,
		MessageID:   e.EventID,
		Type:        e.EventType,
		Timestamp:   e.CreatedAt,
		Headers:     headers,
		Body:        body,
		ContentType: contentType,
	}, nil
}
