package claim

import (
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// scanned holds one row of a claim's result as it is scanned, in the order
// of the claim statements' RETURNING lists. A claim reuses one for all its
// rows: Scan sets every target on every row, NULL included.
type scanned struct {
	id, seq                            int64
	eventID                            string
	aggregateType, aggregateID, evType pgtype.Text
	payload, headers                   []byte // fresh per row; nil for NULL
	exchange, routingKey               pgtype.Text
	createdAt                          time.Time
	attempts                           int
	payloadBytes                       []byte // fresh per row; nil for NULL
	contentType                        pgtype.Text
	orderingKey                        string      // ordered only
	heads                              pgtype.Int8 // ordered only
	more                               bool        // ordered only
}

// targets are the Scan destinations, the ordered statement's three extra
// columns last.
func (r *scanned) targets(ordered bool) []any {
	dest := []any{&r.id, &r.seq, &r.eventID, &r.aggregateType, &r.aggregateID, &r.evType,
		&r.payload, &r.headers, &r.exchange, &r.routingKey, &r.createdAt, &r.attempts,
		&r.payloadBytes, &r.contentType}
	if ordered {
		dest = append(dest, &r.orderingKey, &r.heads, &r.more)
	}
	return dest
}

// event is the row as an Event. Its payload and headers are the row's own:
// the next Scan allocates new ones.
func (r *scanned) event() Event {
	return Event{
		ID: r.id, Seq: r.seq, EventID: r.eventID,
		AggregateType: r.aggregateType.String, AggregateID: r.aggregateID.String, EventType: r.evType.String,
		Payload: r.payload, PayloadBytes: r.payloadBytes, ContentType: r.contentType.String, Headers: r.headers,
		Exchange: r.exchange.String, RoutingKey: r.routingKey.String,
		CreatedAt: r.createdAt, Attempts: r.attempts, OrderingKey: r.orderingKey,
	}
}
