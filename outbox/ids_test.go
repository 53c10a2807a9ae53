package outbox_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/outbox"
)

// readIDs returns the event ids of the table's rows in insert order.
func readIDs(t *testing.T, pool interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, table string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT event_id::text FROM "+table+" ORDER BY id")
	must(t, err, "select the ids")
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	must(t, err, "read the ids")
	return ids
}

// Write returns the ids of the rows it wrote, in order: the caller's, in
// canonical form, and generated version 7 UUIDs for the events without one.
func TestWriteReturnsTheIDsOfTheRowsWritten(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	_, pool := newOutbox(t)
	given := "6BA7B810-9DAD-11D1-80B4-00C04FD430C8" // a version 1 UUID, upper case
	var ids []string
	must(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		ids, err = outbox.Writer{}.Write(ctx, tx,
			outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "created", Payload: 1},
			outbox.Event{ID: given, AggregateType: "order", AggregateID: "1", EventType: "paid", Payload: 2},
			outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "shipped", Payload: 3})
		return err
	}), "Write")
	equal(t, "ids returned", ids, readIDs(t, pool, "outbox"))
	equal(t, "the caller's id", ids[1], strings.ToLower(given))
	for _, i := range []int{0, 2} {
		id, err := uuid.Parse(ids[i])
		must(t, err, "parse a generated id")
		equal(t, "generated id's version", id.Version(), uuid.Version(7))
	}
	if ids[0] == ids[2] {
		t.Fatalf("two generated ids are the same: %s", ids[0])
	}
}

// An id that is not a UUID, the nil UUID, or one two events of a call share
// refuses the call with the validation error before anything is written.
func TestWriteRefusesBadAndDuplicateIDs(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	_, pool := newOutbox(t)
	id := uuid.NewString()
	e := func(id string) outbox.Event {
		return outbox.Event{ID: id, AggregateType: "order", AggregateID: "1", EventType: "created", Payload: 1}
	}
	for _, tc := range []struct {
		name   string
		events []outbox.Event
		want   string
	}{
		{"not a UUID", []outbox.Event{e(""), e("order-42")}, `event 1: ID: "order-42" is not a UUID`},
		{"nil UUID", []outbox.Event{e(uuid.Nil.String())}, "event 0: ID: the nil UUID"},
		{"the same id twice", []outbox.Event{e(id), e(""), e(strings.ToUpper(id))}, "event 2: ID: " + id + " is event 0's too"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				ids, err := outbox.Writer{}.Write(ctx, tx, tc.events...)
				equal(t, "ids of a refused call", len(ids), 0)
				return err
			})
			refused(t, "Write", err, outbox.ErrInvalidEvent, "outbox: invalid event: "+tc.want)
		})
	}
	refused(t, "Validate", e("order-42").Validate(), outbox.ErrInvalidEvent, `ID: "order-42" is not a UUID`)
	equal(t, "events", queryInt(t, pool, "SELECT count(*) FROM outbox"), 0)
}

// Write takes what has Exec, not only a pgx.Tx: a pool and a connection
// write (each call commits on its own); WriteSQL takes a *sql.DB and a
// *sql.Conn as well as a *sql.Tx.
func TestWriteTakesAConnectionOrAPool(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	url, pool := newOutbox(t)
	e := outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "created", Payload: 1}
	var want []string
	add := func(ids []string, err error) {
		t.Helper()
		must(t, err, "write")
		want = append(want, ids...)
	}
	add(outbox.Writer{}.Write(ctx, pool, e))
	conn, err := pool.Acquire(ctx)
	must(t, err, "acquire")
	add(outbox.Writer{}.Write(ctx, conn, e))
	add(outbox.Writer{}.Write(ctx, conn.Conn(), e))
	conn.Release()

	db, err := sql.Open("pgx", url)
	must(t, err, "open database/sql")
	defer db.Close()
	add(outbox.Writer{}.WriteSQL(ctx, db, e))
	sqlConn, err := db.Conn(ctx)
	must(t, err, "database/sql conn")
	add(outbox.Writer{}.WriteSQL(ctx, sqlConn, e))
	must(t, sqlConn.Close(), "close the database/sql conn")
	equal(t, "rows written", readIDs(t, pool, "outbox"), want)
}
