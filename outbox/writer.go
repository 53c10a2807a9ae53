package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/propagation"
)

// Columns names the producer's columns of a table whose names differ from
// the relay's own: the same mapping as the relay's --column-event-id,
// --column-aggregate-type, --column-aggregate-id, --column-event-type,
// --column-payload and --column-status. The headers, exchange, routing_key and available_at
// columns always have those names (the drop-in SQL adds them so).
type Columns struct {
	EventID       string // default "event_id"; uuid (or text)
	AggregateType string // default "aggregate_type"
	AggregateID   string // default "aggregate_id"
	EventType     string // default "event_type"
	Payload       string // default "payload"; jsonb
	Status        string // default "status"; Cancel reads it
}

// Writer writes events into the outbox table inside the caller's
// transaction. The zero Writer writes to "outbox" with the relay's column
// names and the OpenTelemetry global propagator. A Writer is a value: copy
// it, share it between goroutines.
type Writer struct {
	// Table is the outbox table, optionally schema-qualified
	// ("schema.table"); default "outbox", found through search_path.
	Table string
	// Columns maps the producer's columns of an existing table (see the
	// drop-in SQL in docs/producers.md); zero fields keep the relay's names.
	Columns Columns
	// Propagator writes the trace context of the span in Write's ctx into
	// each event's headers. Nil: the OpenTelemetry global one
	// (otel.GetTextMapPropagator), or W3C Trace Context while the
	// application has set none. To write no trace context, set one that
	// propagates nothing: propagation.NewCompositeTextMapPropagator().
	Propagator propagation.TextMapPropagator
	// PendingStatus is the status column's value for a pending event, as
	// the relay's --status-pending; default "pending". Cancel reads it.
	PendingStatus string
}

// Execer is what Write needs of the database: pgx.Tx, *pgx.Conn and
// *pgxpool.Pool have it, and so does anything that wraps them. Pass the
// transaction of the business write, so that the events are committed
// with it; on a connection or a pool, each call commits on its own.
type Execer interface {
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
}

// SQLExecer is what WriteSQL needs of the database: *sql.Tx, *sql.Conn and
// *sql.DB have it, and so do sqlx's and bun's transactions. As for Execer,
// pass the transaction of the business write.
type SQLExecer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Write validates events and inserts them through db in one statement and
// one round trip, in the order given, so that they are published once the
// transaction commits (and never if it rolls back). It returns the events'
// IDs in the same order, those given and those it generated. When ctx
// carries a valid OpenTelemetry span context, each event gets its trace
// context headers (traceparent, tracestate) through Writer.Propagator. If
// any event is invalid, nothing is written and the error wraps
// ErrInvalidEvent and names the event's index and field. Writing no events
// does nothing.
func (w Writer) Write(ctx context.Context, db Execer, events ...Event) ([]string, error) {
	if len(events) == 0 {
		return nil, nil
	}
	stmt, args, ids, err := w.prepare(ctx, events)
	if err != nil {
		return nil, err
	}
	// QueryExecModeExec: one round trip, with no prepare first and nothing
	// cached on the connection.
	if _, err := db.Exec(ctx, stmt, append([]any{pgx.QueryExecModeExec}, args...)...); err != nil {
		return nil, fmt.Errorf("outbox: insert %d events into %s: %w", len(events), w.table(), err)
	}
	return ids, nil
}

// WriteSQL is Write for database/sql, with any PostgreSQL driver (e.g.
// github.com/jackc/pgx/v5/stdlib): the arrays go as text parameters, one
// statement. With pgx's stdlib driver, the statement is prepared on each
// connection's first use (an extra round trip once) unless the URL sets
// default_query_exec_mode=exec.
func (w Writer) WriteSQL(ctx context.Context, db SQLExecer, events ...Event) ([]string, error) {
	if len(events) == 0 {
		return nil, nil
	}
	stmt, args, ids, err := w.prepare(ctx, events)
	if err != nil {
		return nil, err
	}
	if _, err := db.ExecContext(ctx, stmt, args...); err != nil {
		return nil, fmt.Errorf("outbox: insert %d events into %s: %w", len(events), w.table(), err)
	}
	return ids, nil
}

// prepare returns the statement and its arguments for events (nine
// PostgreSQL array literals, one per column, or eleven with the binary
// columns) and the events' IDs.
func (w Writer) prepare(ctx context.Context, events []Event) (string, []any, []string, error) {
	trace := traceHeaders(ctx, w.Propagator)
	ids := make([]string, len(events))
	index := make(map[string]int, len(events))
	var cols [11]arrayBuilder
	binary := false
	for i, e := range events {
		r, err := e.encode(trace)
		if err != nil {
			return "", nil, nil, fmt.Errorf("%w: event %d: %w", ErrInvalidEvent, i, err)
		}
		if j, dup := index[r.eventID]; dup {
			return "", nil, nil, fmt.Errorf("%w: event %d: ID: %s is event %d's too", ErrInvalidEvent, i, r.eventID, j)
		}
		index[r.eventID], ids[i] = i, r.eventID
		cols[0].add(r.eventID, true)
		cols[1].add(r.aggregateType, true)
		cols[2].add(r.aggregateID, true)
		cols[3].add(r.eventType, true)
		cols[4].add(string(r.payload), true)
		cols[5].add(string(r.headers), r.headers != nil)
		cols[6].add(r.exchange, r.exchange != "")
		cols[7].add(r.routingKey, r.routingKey != "")
		cols[8].add(r.notBefore, r.notBefore != "")
		cols[9].add(`\x`+hex.EncodeToString(r.payloadBytes), r.payloadBytes != nil)
		cols[10].add(r.contentType, r.contentType != "")
		binary = binary || r.payloadBytes != nil || r.contentType != ""
	}
	stmt, err := w.statement(binary)
	if err != nil {
		return "", nil, nil, err
	}
	n := 9
	if binary {
		n = 11
	}
	args := make([]any, n)
	for i := range args {
		args[i] = cols[i].String()
	}
	return stmt, args, ids, nil
}

// arrayBuilder writes a PostgreSQL array literal of text elements:
// {"a","b\"c",NULL}.
type arrayBuilder struct {
	b strings.Builder
}

func (a *arrayBuilder) add(s string, valid bool) {
	if a.b.Len() == 0 {
		a.b.WriteByte('{')
	} else {
		a.b.WriteByte(',')
	}
	if !valid {
		a.b.WriteString("NULL")
		return
	}
	a.b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			a.b.WriteByte('\\')
		}
		a.b.WriteByte(s[i])
	}
	a.b.WriteByte('"')
}

func (a *arrayBuilder) String() string {
	if a.b.Len() == 0 {
		return "{}"
	}
	return a.b.String() + "}"
}

// defaultStatement is the insert of the zero Writer: the relay's own table
// and columns. unnest takes the nine arrays side by side; WITH ORDINALITY
// and ORDER BY keep the caller's order, which is the order ids are assigned
// and events are claimed in. An event without NotBefore is due at once, as
// the column's default says.
const defaultStatement = `INSERT INTO "outbox" ("event_id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers", "exchange", "routing_key", "available_at")
SELECT e.event_id::uuid, e.aggregate_type, e.aggregate_id, e.event_type, e.payload::jsonb, e.headers::jsonb, e.exchange, e.routing_key,
    coalesce(e.available_at::timestamptz, now())
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[])
    WITH ORDINALITY AS e (event_id, aggregate_type, aggregate_id, event_type, payload, headers, exchange, routing_key, available_at, n)
ORDER BY e.n`

// binaryStatement is defaultStatement with two columns more, for a call
// with an event that has PayloadBytes or ContentType: a call without such
// an event writes none of the two, so a table the drop-in SQL of an
// earlier version made ready still takes it.
const binaryStatement = `INSERT INTO "outbox" ("event_id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers", "exchange", "routing_key", "available_at", "payload_bytes", "content_type")
SELECT e.event_id::uuid, e.aggregate_type, e.aggregate_id, e.event_type, e.payload::jsonb, e.headers::jsonb, e.exchange, e.routing_key,
    coalesce(e.available_at::timestamptz, now()), e.payload_bytes::bytea, e.content_type
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[], $11::text[])
    WITH ORDINALITY AS e (event_id, aggregate_type, aggregate_id, event_type, payload, headers, exchange, routing_key, available_at, payload_bytes, content_type, n)
ORDER BY e.n`

// target is what a statement is built from: the table, its columns, and
// whether the binary columns are written.
type target struct {
	table   string
	columns Columns
	binary  bool
}

// statements caches each Writer configuration's statement, built once.
var statements sync.Map // target → string

func (w Writer) statement(binary bool) (string, error) {
	t := target{w.Table, w.Columns, binary}
	switch t {
	case target{}:
		return defaultStatement, nil
	case target{binary: true}:
		return binaryStatement, nil
	}
	if s, ok := statements.Load(t); ok {
		return s.(string), nil
	}
	s, err := w.buildStatement(binary)
	if err != nil {
		return "", err
	}
	statements.Store(t, s)
	return s, nil
}

// buildStatement is defaultStatement, or binaryStatement, with the
// Writer's table and columns, quoted identifiers only.
func (w Writer) buildStatement(binary bool) (string, error) {
	table, err := w.tableIdentifier()
	if err != nil {
		return "", err
	}
	cols := []string{
		cmp.Or(w.Columns.EventID, "event_id"),
		cmp.Or(w.Columns.AggregateType, "aggregate_type"),
		cmp.Or(w.Columns.AggregateID, "aggregate_id"),
		cmp.Or(w.Columns.EventType, "event_type"),
		cmp.Or(w.Columns.Payload, "payload"),
		"headers", "exchange", "routing_key", "available_at",
	}
	template := defaultStatement
	if binary {
		cols = append(cols, "payload_bytes", "content_type")
		template = binaryStatement
	}
	quoted := make([]string, len(cols))
	for i, c := range cols {
		if err := checkText(c); err != nil {
			return "", fmt.Errorf("outbox: Writer.Columns: %q: %w", c, err)
		}
		quoted[i] = pgx.Identifier{c}.Sanitize()
	}
	_, rest, _ := strings.Cut(template, "\n")
	return "INSERT INTO " + table.Sanitize() + " (" + strings.Join(quoted, ", ") + ")\n" + rest, nil
}

func (w Writer) table() string { return cmp.Or(w.Table, "outbox") }

// tableIdentifier splits Table on "." into schema and table.
func (w Writer) tableIdentifier() (pgx.Identifier, error) {
	id := pgx.Identifier(strings.Split(w.table(), "."))
	if len(id) > 2 {
		return nil, fmt.Errorf("outbox: Writer.Table %q: want table or schema.table", w.Table)
	}
	for _, part := range id {
		if part == "" {
			return nil, fmt.Errorf("outbox: Writer.Table %q: want table or schema.table", w.Table)
		}
		if err := checkText(part); err != nil {
			return nil, fmt.Errorf("outbox: Writer.Table %q: %w", w.Table, err)
		}
	}
	return id, nil
}
