package outbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// ErrInvalidEvent is wrapped by every error about an event that is refused
// before anything is written: an empty or malformed field, a payload that is
// not JSON, headers the relay would dead-letter. The error names the event's
// index in the call and the field, e.g.
// "outbox: invalid event: event 2: AggregateID: empty".
var ErrInvalidEvent = errors.New("outbox: invalid event")

// maxShortString is the AMQP limit on exchange names, routing keys, the
// type property and header keys (a shortstr): the relay dead-letters an
// event over it.
const maxShortString = 255

// Event is one outbox row: a domain event written in the caller's
// transaction and published by the relay once the transaction commits.
type Event struct {
	// ID is the event's id (optional), the AMQP message id the relay
	// publishes it with and consumers deduplicate on: a UUID in any form
	// uuid.Parse reads, stored and returned in its canonical form. Empty:
	// Write generates a version 7 UUID (time-ordered). Two events of one
	// call may not share an ID; the table does not make IDs unique across
	// calls (a retried request that writes its event again under the same
	// ID is deduplicated by consumers, as any redelivery is).
	ID string
	// AggregateType (e.g. "order") and EventType (e.g. "created") make the
	// default routing key "<AggregateType>.<EventType>"; EventType is the
	// AMQP type property. AggregateID (e.g. "42") is sent as the
	// aggregate_id header. All three are required.
	AggregateType, AggregateID, EventType string
	// Payload is the message body, encoded with encoding/json;
	// json.RawMessage and []byte are taken as they are and must hold valid
	// JSON. A nil Payload is the JSON null.
	Payload any
	// PayloadBytes is the message body for a payload that is not JSON
	// (Protocol Buffers, Avro): the relay publishes these bytes as they
	// are. Payload must be nil then (the row's payload column holds JSON
	// null). Needs the payload_bytes and content_type columns (the relay's
	// migration 010, or its drop-in SQL of this version).
	PayloadBytes []byte
	// ContentType is the AMQP content-type the relay publishes the event
	// with (optional, at most 255 bytes): default application/json, or
	// application/octet-stream with PayloadBytes. Set it with PayloadBytes
	// (application/x-protobuf, say), or for a JSON payload of a more
	// precise media type.
	ContentType string
	// Headers are extra AMQP headers (optional), encoded as a JSON object:
	// strings, numbers, booleans, nil, and maps and slices of them, with
	// keys of at most 255 bytes at any depth. The relay sets aggregate_type
	// and aggregate_id itself, over any of the same name.
	Headers map[string]any
	// Exchange overrides the relay's --exchange for this event (optional).
	Exchange string
	// RoutingKey overrides "<AggregateType>.<EventType>" (optional).
	RoutingKey string
	// NotBefore is when the event falls due (optional): the relay does not
	// publish it before this time, and publishes it within milliseconds
	// after it. The zero time, or a time past: as soon as the transaction
	// commits. Until the relay attempts it, Writer.Cancel deletes it.
	NotBefore time.Time
}

// row is an event encoded for the insert: text columns and the JSON of its
// payload and headers (headers nil for SQL NULL).
type row struct {
	eventID                               string // canonical UUID
	aggregateType, aggregateID, eventType string
	payload                               []byte
	payloadBytes                          []byte // nil: NULL
	contentType                           string // "": NULL
	headers                               []byte // nil: no headers
	exchange, routingKey                  string // "": NULL
	notBefore                             string // timestamptz text; "": NULL
}

// encode validates e and encodes it; trace holds the trace context headers
// to add (nil for none). An event without an ID gets a new one.
func (e Event) encode(trace map[string]string) (row, error) {
	id, err := eventID(e.ID)
	if err != nil {
		return row{}, fieldError("ID", err.Error())
	}
	for _, f := range []struct{ name, value string }{
		{"AggregateType", e.AggregateType},
		{"AggregateID", e.AggregateID},
		{"EventType", e.EventType},
	} {
		if f.value == "" {
			return row{}, fieldError(f.name, "empty")
		}
	}
	for _, f := range []struct{ name, value string }{
		{"AggregateType", e.AggregateType},
		{"AggregateID", e.AggregateID},
		{"EventType", e.EventType},
		{"Exchange", e.Exchange},
		{"RoutingKey", e.RoutingKey},
	} {
		if err := checkText(f.value); err != nil {
			return row{}, fieldError(f.name, err.Error())
		}
	}
	switch key := e.AggregateType + "." + e.EventType; {
	case len(e.EventType) > maxShortString:
		return row{}, fieldError("EventType", fmt.Sprintf("%d bytes, more than %d (the AMQP type)", len(e.EventType), maxShortString))
	case len(e.Exchange) > maxShortString:
		return row{}, fieldError("Exchange", fmt.Sprintf("%d bytes, more than %d", len(e.Exchange), maxShortString))
	case len(e.RoutingKey) > maxShortString:
		return row{}, fieldError("RoutingKey", fmt.Sprintf("%d bytes, more than %d", len(e.RoutingKey), maxShortString))
	case e.RoutingKey == "" && len(key) > maxShortString:
		return row{}, fieldError("RoutingKey", fmt.Sprintf("the default routing key AggregateType.EventType is %d bytes, more than %d; set a shorter RoutingKey", len(key), maxShortString))
	}

	payload, err := encodePayload(e.Payload)
	if err != nil {
		return row{}, fieldError("Payload", err.Error())
	}
	if e.PayloadBytes != nil && e.Payload != nil {
		return row{}, fieldError("PayloadBytes", "set with Payload; an event has one or the other")
	}
	switch {
	case len(e.ContentType) > maxShortString:
		return row{}, fieldError("ContentType", fmt.Sprintf("%d bytes, more than %d", len(e.ContentType), maxShortString))
	case checkText(e.ContentType) != nil:
		return row{}, fieldError("ContentType", checkText(e.ContentType).Error())
	}
	headers, err := encodeHeaders(e.Headers, trace)
	if err != nil {
		return row{}, fieldError("Headers", err.Error())
	}
	var notBefore string
	if !e.NotBefore.IsZero() {
		notBefore = e.NotBefore.Format(time.RFC3339Nano)
	}
	return row{
		eventID:       id,
		aggregateType: e.AggregateType,
		aggregateID:   e.AggregateID,
		eventType:     e.EventType,
		payload:       payload,
		payloadBytes:  e.PayloadBytes,
		contentType:   e.ContentType,
		headers:       headers,
		exchange:      e.Exchange,
		routingKey:    e.RoutingKey,
		notBefore:     notBefore,
	}, nil
}

// eventID returns the canonical form of the caller's id, or a new version 7
// UUID when it is empty. Version 7 ids grow with time, so the indexes
// consumers keep on them (an inbox's) take them in order.
func eventID(s string) (string, error) {
	if s == "" {
		id, err := uuid.NewV7()
		if err != nil {
			return "", fmt.Errorf("generate: %w", err)
		}
		return id.String(), nil
	}
	id, err := uuid.Parse(s)
	switch {
	case err != nil:
		return "", fmt.Errorf("%.64q is not a UUID", s)
	case id == uuid.Nil:
		return "", errors.New("the nil UUID")
	}
	return id.String(), nil
}

// Validate reports why the event would be refused by Write, wrapping
// ErrInvalidEvent. Write and WriteSQL validate every event themselves; this
// is for checking an event early.
func (e Event) Validate() error {
	if _, err := e.encode(nil); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidEvent, err)
	}
	return nil
}

func fieldError(field, reason string) error {
	return fmt.Errorf("%s: %s", field, reason)
}

// checkText refuses what a PostgreSQL text column cannot hold.
func checkText(s string) error {
	switch {
	case !utf8.ValidString(s):
		return errors.New("not valid UTF-8")
	case bytes.IndexByte([]byte(s), 0) >= 0:
		return errors.New("contains a NUL byte")
	}
	return nil
}

// encodePayload returns the payload's JSON.
func encodePayload(p any) ([]byte, error) {
	var b []byte
	switch p := p.(type) {
	case json.RawMessage:
		b = p
	case []byte:
		b = p
	default:
		var err error
		if b, err = json.Marshal(p); err != nil {
			return nil, err
		}
	}
	if !json.Valid(b) {
		return nil, errors.New("not valid JSON")
	}
	if err := checkJSONText(b); err != nil {
		return nil, err
	}
	return b, nil
}

// checkJSONText refuses what jsonb cannot hold: a string or key with the
// escape \u0000 (raw NUL bytes are not valid JSON in the first place).
func checkJSONText(b []byte) error {
	if !bytes.Contains(b, []byte(`\u0000`)) {
		return nil // the common case: no need to decode
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil // the end; b is valid JSON
		}
		if s, ok := tok.(string); ok && bytes.IndexByte([]byte(s), 0) >= 0 {
			return errors.New(`holds the escape \u0000, which PostgreSQL's jsonb cannot store`)
		}
	}
}
