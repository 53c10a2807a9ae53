package outbox_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/outbox"
)

// NotBefore is the row's available_at, to the microsecond PostgreSQL keeps,
// whatever the time's zone; an event without it is due when its transaction
// began (the column's default), as before.
func TestNotBeforeIsWhenTheRowFallsDue(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	url, pool := newOutbox(t)
	in := time.Date(2030, 1, 2, 3, 4, 5, 678901234, time.FixedZone("UTC+5:30", 5*3600+1800))
	e := outbox.Event{AggregateType: "reminder", AggregateID: "1", EventType: "due", Payload: 1}
	scheduled := e
	scheduled.NotBefore = in
	var began time.Time
	must(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, "SELECT now()").Scan(&began); err != nil {
			return err
		}
		_, err := outbox.Writer{}.Write(ctx, tx, e, scheduled)
		return err
	}), "Write")
	db := openSQL(t, url)
	_, err := outbox.Writer{}.WriteSQL(ctx, db, scheduled)
	must(t, err, "WriteSQL")

	rows, err := pool.Query(ctx, "SELECT available_at FROM outbox ORDER BY id")
	must(t, err, "select")
	due, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
	must(t, err, "read")
	equal(t, "rows", len(due), 3)
	equal(t, "due at once", due[0].Equal(began), true)
	want := in.Truncate(time.Microsecond)
	for i, d := range due[1:] {
		if !d.Equal(want) {
			t.Errorf("scheduled row %d: available_at %s, want %s", i, d, want)
		}
	}
}
