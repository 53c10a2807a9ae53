package relay

import (
	"cmp"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/publish"
)

// CloudEvents modes (Config.CloudEvents): how an event is published as a
// CloudEvent (version 1.0).
const (
	// CloudEventsBinary puts the event's attributes in ce- headers and
	// its data, as it is, in the body, with the row's content type:
	// CloudEvents' binary content mode.
	CloudEventsBinary = "binary"
	// CloudEventsStructured publishes the whole event as a JSON object
	// (application/cloudevents+json): CloudEvents' structured content mode.
	CloudEventsStructured = "structured"
)

// CloudEvents attributes, from the row:
//
//	id           event_id
//	source       Config.CloudEventsSource
//	type         <aggregate_type>.<event_type>
//	subject      aggregate_id
//	time         created_at
//	datacontenttype  the message's content type (content_type, or its default)
//
// The trace context stays where Message puts it, in the traceparent and
// tracestate headers (with tracing on, the publish span's); structured
// mode also carries the producer's as the traceparent and tracestate
// extensions of the event.
const (
	ceSpecVersion    = "1.0"
	ceStructuredType = "application/cloudevents+json"
	ceHeaderPrefix   = "ce-"
)

// cloudEvent turns m, the plain message of e, into a CloudEvent in mode.
func cloudEvent(m publish.Message, e claim.Event, mode, source string) (publish.Message, error) {
	attrs := [][2]string{
		{"specversion", ceSpecVersion},
		{"id", e.EventID},
		{"source", source},
		{"type", e.AggregateType + "." + e.EventType},
		{"subject", e.AggregateID},
		{"time", e.CreatedAt.UTC().Format(time.RFC3339Nano)},
	}
	contentType := cmp.Or(m.ContentType, publish.ContentTypeJSON)
	switch mode {
	case CloudEventsBinary:
		for _, a := range attrs {
			m.Headers[ceHeaderPrefix+a[0]] = a[1]
		}
		m.ContentType = contentType
		return m, nil
	case CloudEventsStructured:
		doc := make(map[string]any, len(attrs)+4)
		for _, a := range attrs {
			doc[a[0]] = a[1]
		}
		doc["datacontenttype"] = contentType
		if e.PayloadBytes != nil {
			doc["data_base64"] = base64.StdEncoding.EncodeToString(m.Body)
		} else {
			doc["data"] = json.RawMessage(m.Body)
		}
		for _, k := range []string{"traceparent", "tracestate"} {
			if v, ok := m.Headers[k].(string); ok && v != "" {
				doc[k] = v
			}
		}
		body, err := json.Marshal(doc)
		if err != nil {
			return publish.Message{}, fmt.Errorf("event %d as a CloudEvent: %w: %w", e.ID, publish.ErrInvalid, err)
		}
		m.Body, m.ContentType = body, ceStructuredType
		return m, nil
	}
	return m, nil
}

// message is the message the relay publishes for e: Message's, as a
// CloudEvent if Config.CloudEvents says so.
func (r *Relay) message(e claim.Event) (publish.Message, error) {
	m, err := Message(e)
	if err != nil || r.cfg.CloudEvents == "" {
		return m, err
	}
	return cloudEvent(m, e, r.cfg.CloudEvents, r.cfg.CloudEventsSource)
}
