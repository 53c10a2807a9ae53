package outbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxrelay/outboxrelay/outbox"
)

// queryCounter is a pgx tracer counting the statements sent.
type queryCounter struct {
	n   atomic.Int64
	sql atomic.Value // string: the last statement
}

func (c *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	c.sql.Store(data.SQL)
	return ctx
}

func (c *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// storedRow is an outbox row as the relay reads it.
type storedRow struct {
	AggregateType, AggregateID, EventType string
	Payload                               string
	Headers                               *string
	Exchange, RoutingKey                  *string
}

func readRows(t *testing.T, pool *pgxpool.Pool, table, cols string) []storedRow {
	t.Helper()
	rows, err := pool.Query(testContext(t), "SELECT "+cols+" FROM "+table+" ORDER BY 1")
	must(t, err, "select the rows")
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (storedRow, error) {
		var s storedRow
		var id int64
		err := r.Scan(&id, &s.AggregateType, &s.AggregateID, &s.EventType, &s.Payload, &s.Headers, &s.Exchange, &s.RoutingKey)
		return s, err
	})
	must(t, err, "read the rows")
	return out
}

const outboxCols = "id, aggregate_type, aggregate_id, event_type, payload::text, headers::text, exchange, routing_key"

func ptr(s string) *string { return &s }

// A thousand events are one INSERT, one statement on the wire, and land in
// the order given.
func TestWriteIsOneStatement(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	url, pool := newOutbox(t)
	config, err := pgx.ParseConfig(url)
	must(t, err, "parse the URL")
	counter := &queryCounter{}
	config.Tracer = counter
	conn, err := pgx.ConnectConfig(ctx, config)
	must(t, err, "connect")
	defer conn.Close(ctx)

	events := make([]outbox.Event, 1000)
	for i := range events {
		events[i] = outbox.Event{AggregateType: "order", AggregateID: fmt.Sprint(i % 7), EventType: "created",
			Payload: map[string]int{"n": i}}
	}
	tx, err := conn.Begin(ctx)
	must(t, err, "begin")
	before := counter.n.Load()
	_, err = outbox.Writer{}.Write(ctx, tx, events...)
	must(t, err, "Write")
	equal(t, "statements sent by Write", counter.n.Load()-before, 1)
	if stmt := counter.sql.Load().(string); !strings.HasPrefix(stmt, `INSERT INTO "outbox"`) {
		t.Fatalf("Write sent %q, want an INSERT INTO \"outbox\"", stmt)
	}
	must(t, tx.Commit(ctx), "commit")

	rows := readRows(t, pool, "outbox", outboxCols)
	equal(t, "rows", len(rows), 1000)
	for i, r := range rows {
		equal(t, fmt.Sprintf("row %d", i), r, storedRow{AggregateType: "order", AggregateID: fmt.Sprint(i % 7),
			EventType: "created", Payload: fmt.Sprintf(`{"n": %d}`, i)})
	}
}

// Every field lands in its column, with text that needs quoting in an
// array literal, through both pgx and database/sql.
func TestWriteAndWriteSQLStoreEveryField(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	url, pool := newOutbox(t)
	odd := `a "quoted", {braced} \back\slashed NULL ünïcode`
	events := []outbox.Event{
		{AggregateType: "order", AggregateID: odd, EventType: "created", Payload: map[string]string{"s": odd}},
		{AggregateType: "order", AggregateID: "2", EventType: "paid", Payload: json.RawMessage(`[1, 2.5, null]`),
			Headers:  map[string]any{"tenant": "acme", "n": 7, "nested": map[string]any{"list": []any{true, nil}}},
			Exchange: "billing", RoutingKey: "billing.paid"},
		{AggregateType: "NULL", AggregateID: "3", EventType: "x", Payload: []byte(` "just a string" `)},
	}

	must(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Writer{}.Write(ctx, tx, events...)
		return err
	}), "Write")
	db, err := sql.Open("pgx", url)
	must(t, err, "open database/sql")
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	must(t, err, "begin")
	_, err = outbox.Writer{}.WriteSQL(ctx, tx, events...)
	must(t, err, "WriteSQL")
	must(t, tx.Commit(), "commit")

	rows := readRows(t, pool, "outbox", outboxCols)
	equal(t, "rows", len(rows), 6)
	want := []storedRow{
		{AggregateType: "order", AggregateID: odd, EventType: "created", Payload: `{"s": "a \"quoted\", {braced} \\back\\slashed NULL ünïcode"}`},
		{AggregateType: "order", AggregateID: "2", EventType: "paid", Payload: `[1, 2.5, null]`,
			Headers:  ptr(`{"n": 7, "nested": {"list": [true, null]}, "tenant": "acme"}`),
			Exchange: ptr("billing"), RoutingKey: ptr("billing.paid")},
		{AggregateType: "NULL", AggregateID: "3", EventType: "x", Payload: `"just a string"`},
	}
	equal(t, "through pgx", rows[:3], want)
	equal(t, "through database/sql", rows[3:], want)
}

func TestRolledBackWriteLeavesNothing(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	_, pool := newOutbox(t)
	tx, err := pool.Begin(ctx)
	must(t, err, "begin")
	_, err = outbox.Writer{}.Write(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "created", Payload: 1})
	must(t, err, "Write")
	must(t, tx.Rollback(ctx), "roll back")
	equal(t, "events", queryInt(t, pool, "SELECT count(*) FROM outbox"), 0)
}

func TestWriteNothing(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	_, pool := newOutbox(t)
	must(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		ids, err := outbox.Writer{}.Write(ctx, tx)
		equal(t, "ids of no events", len(ids), 0)
		return err
	}), "Write")
	equal(t, "events", queryInt(t, pool, "SELECT count(*) FROM outbox"), 0)
}

// A bad event refuses the whole call before anything is sent, names the
// event and the field, and leaves the transaction usable.
func TestWriteRefusesInvalidEvents(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	url, pool := newOutbox(t)
	db, err := sql.Open("pgx", url)
	must(t, err, "open database/sql")
	defer db.Close()
	good := outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "created", Payload: map[string]int{"id": 1}}
	long := strings.Repeat("k", 256)
	for _, tc := range []struct {
		name   string
		modify func(*outbox.Event)
		want   string
	}{
		{"no aggregate type", func(e *outbox.Event) { e.AggregateType = "" }, "AggregateType: empty"},
		{"no aggregate id", func(e *outbox.Event) { e.AggregateID = "" }, "AggregateID: empty"},
		{"no event type", func(e *outbox.Event) { e.EventType = "" }, "EventType: empty"},
		{"NUL in aggregate id", func(e *outbox.Event) { e.AggregateID = "a\x00b" }, "AggregateID: contains a NUL byte"},
		{"invalid UTF-8 event type", func(e *outbox.Event) { e.EventType = "\xff" }, "EventType: not valid UTF-8"},
		{"long event type", func(e *outbox.Event) { e.EventType = long }, "EventType: 256 bytes, more than 255"},
		{"long exchange", func(e *outbox.Event) { e.Exchange = long }, "Exchange: 256 bytes, more than 255"},
		{"long routing key", func(e *outbox.Event) { e.RoutingKey = long }, "RoutingKey: 256 bytes, more than 255"},
		{"long default routing key", func(e *outbox.Event) { e.AggregateType = long[:200]; e.EventType = long[:60] }, "RoutingKey: the default routing key"},
		{"raw payload not JSON", func(e *outbox.Event) { e.Payload = json.RawMessage(`{"a":`) }, "Payload: not valid JSON"},
		{"bytes payload not JSON", func(e *outbox.Event) { e.Payload = []byte("hello") }, "Payload: not valid JSON"},
		{"empty raw payload", func(e *outbox.Event) { e.Payload = json.RawMessage(nil) }, "Payload: not valid JSON"},
		{"payload json cannot encode", func(e *outbox.Event) { e.Payload = map[string]any{"c": make(chan int)} }, "Payload: json: unsupported type: chan int"},
		{"payload NUL escape", func(e *outbox.Event) { e.Payload = map[string]string{"s": "a\x00"} }, `Payload: holds the escape \u0000`},
		{"header json cannot encode", func(e *outbox.Event) { e.Headers = map[string]any{"f": func() {}} }, "Headers: json: unsupported type: func()"},
		{"header key too long", func(e *outbox.Event) { e.Headers = map[string]any{long: 1} }, "Headers: key"},
		{"nested header key too long", func(e *outbox.Event) { e.Headers = map[string]any{"a": []any{map[string]any{long: 1}}} }, `Headers: field "a": element 0: key`},
		{"header number out of range", func(e *outbox.Event) { e.Headers = map[string]any{"big": json.Number("1e400")} }, `Headers: field "big": number 1e400`},
		{"header NUL escape", func(e *outbox.Event) { e.Headers = map[string]any{"s": "\x00"} }, `Headers: holds the escape \u0000`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := good
			tc.modify(&bad)
			refused(t, "Validate", bad.Validate(), outbox.ErrInvalidEvent, tc.want)

			tx, err := pool.Begin(ctx)
			must(t, err, "begin")
			defer tx.Rollback(ctx)
			ids, err := outbox.Writer{}.Write(ctx, tx, good, good, bad, good)
			equal(t, "ids of a refused call", len(ids), 0)
			refused(t, "Write", err, outbox.ErrInvalidEvent, "outbox: invalid event: event 2: "+tc.want)
			var one int
			must(t, tx.QueryRow(ctx, "SELECT count(*) + 1 FROM outbox").Scan(&one), "the transaction is still usable")
			equal(t, "nothing was written: count + 1", one, 1)

			sqlTx, err := db.BeginTx(ctx, nil)
			must(t, err, "begin database/sql")
			defer sqlTx.Rollback()
			_, err = outbox.Writer{}.WriteSQL(ctx, sqlTx, bad)
			refused(t, "WriteSQL", err, outbox.ErrInvalidEvent, "event 0: "+tc.want)
		})
	}
	must(t, good.Validate(), "Validate of the good event")
	equal(t, "events", queryInt(t, pool, "SELECT count(*) FROM outbox"), 0)
}

func TestWriterRefusesBadTableNames(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	_, pool := newOutbox(t)
	for _, table := range []string{"a.b.c", ".outbox", "public.", "bad\x00name"} {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := outbox.Writer{Table: table}.Write(ctx, tx, outbox.Event{AggregateType: "a", AggregateID: "1", EventType: "e", Payload: 1})
			return err
		})
		if err == nil || !strings.Contains(err.Error(), "outbox: Writer.Table") {
			t.Fatalf("table %q: got %v, want an error about Writer.Table", table, err)
		}
		if errors.Is(err, outbox.ErrInvalidEvent) {
			t.Fatalf("table %q: %v wraps ErrInvalidEvent, but the events are valid", table, err)
		}
	}
}

// A table in a schema of its own, with a name that needs quoting.
func TestWriteToSchemaQualifiedTable(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	_, pool := newOutbox(t)
	schema := `odd "schema"; --`
	execSQL(t, pool, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	table := pgx.Identifier{schema, "Events"}.Sanitize()
	execSQL(t, pool, "CREATE TABLE "+table+" (LIKE public.outbox INCLUDING DEFAULTS INCLUDING IDENTITY)")

	w := outbox.Writer{Table: schema + ".Events"}
	must(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := w.Write(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "created", Payload: "x"})
		return err
	}), "Write")
	equal(t, "rows", readRows(t, pool, table, outboxCols),
		[]storedRow{{AggregateType: "order", AggregateID: "1", EventType: "created", Payload: `"x"`}})
	equal(t, "events in public.outbox", queryInt(t, pool, "SELECT count(*) FROM public.outbox"), 0)
}

// A team's own table, made ready by the drop-in SQL, with the producer's
// columns mapped as the relay's --column-* flags map them.
func TestWriteToDropInTable(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	dbURL := newDatabase(t)
	pool := newPool(t, dbURL)
	execSQL(t, pool, `CREATE TABLE app_events (
		uid         uuid PRIMARY KEY DEFAULT gen_random_uuid(),
		entity_type varchar(100) NOT NULL,
		entity_id   varchar(100) NOT NULL,
		kind        text NOT NULL,
		body        jsonb NOT NULL,
		state       varchar(20) NOT NULL DEFAULT 'NEW',
		occurred_at timestamptz NOT NULL DEFAULT now()
	)`)
	out, err := exec.Command("psql", dbURL, "-X", "-q", "-v", "table=app_events", "-v", "id_column=seq",
		"-v", "event_id_column=uid", "-v", "status_column=state", "-v", "created_at_column=occurred_at",
		"-v", "status_pending=NEW", "-v", "status_published=SENT", "-v", "status_failed=DEAD",
		"-f", "../sql/outboxrelay_install.sql").CombinedOutput()
	must(t, err, "psql -f ../sql/outboxrelay_install.sql:\n"+string(out))

	w := outbox.Writer{Table: "public.app_events", Columns: outbox.Columns{EventID: "uid",
		AggregateType: "entity_type", AggregateID: "entity_id", EventType: "kind", Payload: "body"}}
	db, err := sql.Open("pgx", dbURL)
	must(t, err, "open database/sql")
	defer db.Close()
	tx, err := db.BeginTx(ctx, nil)
	must(t, err, "begin")
	ids, err := w.WriteSQL(ctx, tx,
		outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "created", Payload: map[string]int{"id": 1}},
		outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "paid", Payload: map[string]int{"id": 1},
			Headers: map[string]any{"tenant": "acme"}, RoutingKey: "orders.paid"})
	must(t, err, "WriteSQL")
	must(t, tx.Commit(), "commit")
	must(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		more, err := w.Write(ctx, tx, outbox.Event{AggregateType: "invoice", AggregateID: "9", EventType: "sent", Payload: nil, Exchange: "billing"})
		ids = append(ids, more...)
		return err
	}), "Write")
	rows, err := pool.Query(ctx, "SELECT uid::text FROM app_events ORDER BY seq")
	must(t, err, "select the event ids")
	uids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	must(t, err, "read the event ids")
	equal(t, "the ids returned are the table's event id column", ids, uids)

	equal(t, "rows", readRows(t, pool, "app_events", "seq, entity_type, entity_id, kind, body::text, headers::text, exchange, routing_key"), []storedRow{
		{AggregateType: "order", AggregateID: "1", EventType: "created", Payload: `{"id": 1}`},
		{AggregateType: "order", AggregateID: "1", EventType: "paid", Payload: `{"id": 1}`, Headers: ptr(`{"tenant": "acme"}`), RoutingKey: ptr("orders.paid")},
		{AggregateType: "invoice", AggregateID: "9", EventType: "sent", Payload: `null`, Exchange: ptr("billing")},
	})
	equal(t, "events pending", queryInt(t, pool, "SELECT count(*) FROM app_events WHERE state = 'NEW'"), 3)
}
