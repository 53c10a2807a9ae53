// Package outbox is the producer side of outboxrelay: it writes events into
// the outbox table inside the application's own transaction, so that an
// event exists exactly when the business change it describes was committed.
// The relay (a separate process) publishes every committed event to
// RabbitMQ; a rolled-back transaction leaves nothing behind.
//
//	tx, err := pool.Begin(ctx)
//	...
//	defer tx.Rollback(ctx)
//	// ... the business write ...
//	ids, err := outbox.Writer{}.Write(ctx, tx, outbox.Event{
//		AggregateType: "order", AggregateID: "42", EventType: "created",
//		Payload: order,
//	})
//	...
//	err = tx.Commit(ctx)
//
// Write takes a pgx.Tx (or anything with pgx's Exec: a connection, a pool,
// a wrapper), WriteSQL a database/sql *sql.Tx (or anything with
// ExecContext), with any PostgreSQL driver (e.g.
// github.com/jackc/pgx/v5/stdlib). Both insert any number of events in one
// statement, one round trip, in the order given, and return their ids: the
// AMQP message ids the relay publishes them with, the caller's (Event.ID)
// or generated ones. Event.NotBefore schedules an event: the relay
// publishes it at that time, not before.
//
// # Validation
//
// Every event is checked before anything is written, against what the table
// and the relay accept: the aggregate type, aggregate id and event type are
// required; the payload must be JSON; headers must be what the relay can turn
// into AMQP headers (a JSON object whose keys, at any depth, are at most 255
// bytes, with numbers a float64 can hold); the event type, exchange and
// routing key (given, or the default "<aggregate type>.<event type>") must
// fit AMQP's 255 bytes. A refused call returns an error wrapping
// ErrInvalidEvent that names the event's index and the field, and leaves
// the transaction as it was. The relay's --max-message-size is not checked
// here: a larger payload is dead-lettered by the relay.
//
// # Tables
//
// The zero Writer writes to the relay's own table, "outbox", found through
// the connection's search_path. Writer.Table names another table, optionally
// schema-qualified ("billing.outbox"); Writer.Columns maps the columns of an
// existing table made ready by the relay's drop-in SQL, with the same names
// as the relay's --column-* flags. Names are quoted identifiers; the
// statement is built once per Writer configuration.
//
// # Trace context
//
// When ctx carries a valid OpenTelemetry span context, Write adds it to each
// event's headers through Writer.Propagator or, by default, the global
// propagator (otel.GetTextMapPropagator),
// so consumers can continue the producer's trace. While the application has
// set no propagator (otel's default injects nothing), W3C Trace Context is
// used, so traceparent (and tracestate, when there is one) are written out of
// the box; set one with otel.SetTextMapPropagator to choose otherwise. An
// event whose Headers already hold a traceparent keeps its own. The caller's
// Headers map is never modified.
//
// # Compatibility
//
// The package is a Go module of its own, github.com/outboxrelay/outboxrelay/outbox,
// apart from the relay's: an application that writes events depends on pgx,
// database/sql, github.com/google/uuid and the OpenTelemetry API (not its
// SDK), and on nothing of the relay. Its exported API is a compatibility
// promise. Releases are tagged outbox/vX.Y.Z in the relay's repository (the
// Go convention for a module in a subdirectory), versioned apart from the
// relay with semantic versions: a change that would break code written
// against an earlier release comes only with a new major version.
//
// It needs Go 1.23 or later (the go line of its go.mod, which pgx v5.7.6
// requires; its own code needs 1.22), github.com/jackc/pgx/v5 v5.7.6,
// github.com/google/uuid v1.6.0 and go.opentelemetry.io/otel v1.31.0 (with
// otel/trace). These are minimums:
// an application that requires newer versions gets them, and should where its
// Go allows (pgx v5.9.2 and later carry security fixes and need Go 1.25).
package outbox
