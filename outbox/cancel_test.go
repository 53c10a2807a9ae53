package outbox_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/outbox"
)

// Cancel deletes the events no relay has taken, in the caller's
// transaction (a rollback keeps them), and returns the IDs it deleted, in
// the order given and in canonical form: not one a relay took (leased and
// attempted, as a claim leaves it) nor one that is gone.
func TestCancelDeletesOnlyEventsNoRelayTook(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	url, pool := newOutbox(t)
	later := time.Now().Add(time.Hour)
	e := outbox.Event{AggregateType: "cart", AggregateID: "7", EventType: "expired", Payload: 1, NotBefore: later}
	ids, err := outbox.Writer{}.Write(ctx, pool, e, e, e)
	must(t, err, "Write")
	// The third is taken by a relay: its claim sets a lease and counts an
	// attempt.
	execSQL(t, pool, `UPDATE outbox SET lease_id = gen_random_uuid(), attempts = 1, available_at = now() + interval '30 seconds' WHERE event_id = $1`, ids[2])

	rollback := errors.New("roll back")
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		cancelled, err := outbox.Writer{}.Cancel(ctx, tx, ids[0])
		must(t, err, "Cancel")
		equal(t, "cancelled before the rollback", strings.Join(cancelled, ","), ids[0])
		return rollback
	})
	equal(t, "rolled back", errors.Is(err, rollback), true)
	equal(t, "rows after the rollback", queryInt(t, pool, `SELECT count(*) FROM outbox`), int64(3))

	cancelled, err := outbox.Writer{}.Cancel(ctx, pool, ids[2], "0190a5a4-7f3c-7000-8000-000000000001", strings.ToUpper(ids[0]))
	must(t, err, "Cancel")
	equal(t, "cancelled: the first (any form of its id, returned as Write returned it), not the taken one nor an unknown one",
		strings.Join(cancelled, ","), ids[0])
	cancelled, err = outbox.Writer{}.CancelSQL(ctx, openSQL(t, url), ids[0], ids[1], ids[1])
	must(t, err, "CancelSQL")
	equal(t, "cancelled: the second, once; the first is gone already", strings.Join(cancelled, ","), ids[1])
	rows, err := pool.Query(ctx, `SELECT event_id::text FROM outbox`)
	must(t, err, "select")
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	must(t, err, "read")
	equal(t, "left", strings.Join(left, ","), ids[2])
}

// An id that is not a UUID is refused with the validation error, and
// nothing is deleted.
func TestCancelRefusesAnInvalidID(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	_, pool := newOutbox(t)
	ids, err := outbox.Writer{}.Write(ctx, pool, outbox.Event{AggregateType: "a", AggregateID: "1", EventType: "b", NotBefore: time.Now().Add(time.Hour)})
	must(t, err, "Write")
	for _, bad := range []string{"", "not-a-uuid", "00000000-0000-0000-0000-000000000000"} {
		_, err := outbox.Writer{}.Cancel(ctx, pool, ids[0], bad)
		equal(t, bad+": ErrInvalidEvent", errors.Is(err, outbox.ErrInvalidEvent), true)
	}
	equal(t, "rows", queryInt(t, pool, `SELECT count(*) FROM outbox`), int64(1))
}

// Cancel finds an event through the pending rows' event id index, not by
// reading the table: on a table of published rows, the plan of its
// statement names the index.
func TestCancelReadsTheEventIDIndex(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	_, pool := newOutbox(t)
	execSQL(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, status)
		SELECT 'a', i::text, 'b', '{}', CASE WHEN i % 100 = 0 THEN 'pending' ELSE 'published' END FROM generate_series(1, 20000) AS i`)
	execSQL(t, pool, `ANALYZE outbox`)
	stmt := outbox.CancelStatement(outbox.Writer{})
	rows, err := pool.Query(ctx, "EXPLAIN "+stmt, pgx.QueryExecModeExec, "{0190a5a4-7f3c-7000-8000-000000000001}")
	must(t, err, "explain")
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	must(t, err, "read the plan")
	text := strings.Join(plan, "\n")
	if !strings.Contains(text, "outbox_pending_event_id_idx") {
		t.Errorf("the plan does not read the event id index:\n%s", text)
	}
}
