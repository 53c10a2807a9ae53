package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// Columns names the producer's columns of a table whose names differ from
// the relay's own: the same mapping as the relay's --column-aggregate-type,
// --column-aggregate-id, --column-event-type and --column-payload. The
// headers, exchange and routing_key columns always have those names (the
// drop-in SQL adds them so).
type Columns struct {
	AggregateType string // default "aggregate_type"
	AggregateID   string // default "aggregate_id"
	EventType     string // default "event_type"
	Payload       string // default "payload"; jsonb
}

// Writer writes events into the outbox table inside the caller's
// transaction. The zero Writer writes to "outbox" with the relay's column
// names. A Writer is a value: copy it, share it between goroutines.
type Writer struct {
	// Table is the outbox table, optionally schema-qualified
	// ("schema.table"); default "outbox", found through search_path.
	Table string
	// Columns maps the producer's columns of an existing table (see the
	// drop-in SQL in docs/producers.md); zero fields keep the relay's names.
	Columns Columns
}

// Write validates events and inserts them through tx in one statement and
// one round trip, in the order given, so that they are published once tx
// commits (and never if it rolls back). When ctx carries a valid
// OpenTelemetry span context, each event gets its trace context headers
// (traceparent, tracestate). If any event is invalid, nothing is written and
// the error wraps ErrInvalidEvent and names the event's index and field.
// Writing no events does nothing.
func (w Writer) Write(ctx context.Context, tx pgx.Tx, events ...Event) error {
	if len(events) == 0 {
		return nil
	}
	stmt, args, err := w.prepare(ctx, events)
	if err != nil {
		return err
	}
	// QueryExecModeExec: one round trip, with no prepare first and nothing
	// cached on the connection.
	if _, err := tx.Exec(ctx, stmt, append([]any{pgx.QueryExecModeExec}, args...)...); err != nil {
		return fmt.Errorf("outbox: insert %d events into %s: %w", len(events), w.table(), err)
	}
	return nil
}

// WriteSQL is Write for a database/sql transaction, with any PostgreSQL
// driver (e.g. github.com/jackc/pgx/v5/stdlib): the arrays go as text
// parameters, one statement. With pgx's stdlib driver, the statement is
// prepared on each connection's first use (an extra round trip once) unless
// the URL sets default_query_exec_mode=exec.
func (w Writer) WriteSQL(ctx context.Context, tx *sql.Tx, events ...Event) error {
	if len(events) == 0 {
		return nil
	}
	stmt, args, err := w.prepare(ctx, events)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, stmt, args...); err != nil {
		return fmt.Errorf("outbox: insert %d events into %s: %w", len(events), w.table(), err)
	}
	return nil
}

// prepare returns the statement and its arguments for events: seven
// PostgreSQL array literals, one per column.
func (w Writer) prepare(ctx context.Context, events []Event) (string, []any, error) {
	stmt, err := w.statement()
	if err != nil {
		return "", nil, err
	}
	trace := traceHeaders(ctx)
	var cols [7]arrayBuilder
	for i, e := range events {
		r, err := e.encode(trace)
		if err != nil {
			return "", nil, fmt.Errorf("%w: event %d: %w", ErrInvalidEvent, i, err)
		}
		cols[0].add(r.aggregateType, true)
		cols[1].add(r.aggregateID, true)
		cols[2].add(r.eventType, true)
		cols[3].add(string(r.payload), true)
		cols[4].add(string(r.headers), r.headers != nil)
		cols[5].add(r.exchange, r.exchange != "")
		cols[6].add(r.routingKey, r.routingKey != "")
	}
	args := make([]any, len(cols))
	for i := range cols {
		args[i] = cols[i].String()
	}
	return stmt, args, nil
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
// and columns. unnest takes the seven arrays side by side; WITH ORDINALITY
// and ORDER BY keep the caller's order, which is the order ids are assigned
// and events are claimed in.
const defaultStatement = `INSERT INTO "outbox" ("aggregate_type", "aggregate_id", "event_type", "payload", "headers", "exchange", "routing_key")
SELECT e.aggregate_type, e.aggregate_id, e.event_type, e.payload::jsonb, e.headers::jsonb, e.exchange, e.routing_key
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[])
    WITH ORDINALITY AS e (aggregate_type, aggregate_id, event_type, payload, headers, exchange, routing_key, n)
ORDER BY e.n`

// statements caches each Writer configuration's statement, built once.
var statements sync.Map // Writer → string

func (w Writer) statement() (string, error) {
	if w == (Writer{}) {
		return defaultStatement, nil
	}
	if s, ok := statements.Load(w); ok {
		return s.(string), nil
	}
	s, err := w.buildStatement()
	if err != nil {
		return "", err
	}
	statements.Store(w, s)
	return s, nil
}

// buildStatement is defaultStatement with the Writer's table and columns,
// quoted identifiers only.
func (w Writer) buildStatement() (string, error) {
	table, err := w.tableIdentifier()
	if err != nil {
		return "", err
	}
	cols := []string{
		cmp.Or(w.Columns.AggregateType, "aggregate_type"),
		cmp.Or(w.Columns.AggregateID, "aggregate_id"),
		cmp.Or(w.Columns.EventType, "event_type"),
		cmp.Or(w.Columns.Payload, "payload"),
		"headers", "exchange", "routing_key",
	}
	quoted := make([]string, len(cols))
	for i, c := range cols {
		if err := checkText(c); err != nil {
			return "", fmt.Errorf("outbox: Writer.Columns: %q: %w", c, err)
		}
		quoted[i] = pgx.Identifier{c}.Sanitize()
	}
	_, rest, _ := strings.Cut(defaultStatement, "\n")
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
