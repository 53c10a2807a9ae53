package main_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/notify"
)

// requeueOut is the JSON of outboxrelay requeue.
type requeueOut struct {
	DryRun   bool      `json:"dry_run"`
	Matched  int64     `json:"matched"`
	Requeued int64     `json:"requeued"`
	IDs      []int64   `json:"ids"`
	Missing  []int64   `json:"missing_ids"`
	Events   []deadOut `json:"events"`
}

// An event whose exchange does not exist is dead-lettered by a real relay;
// once the exchange exists, requeue puts it back and it arrives at once.
// The relay's fallback poll is an hour away, so only requeue's NOTIFY can
// wake it, and the relay must not have remembered the missing exchange.
func TestRequeuedEventIsPublishedAtOnce(t *testing.T) {
	t.Parallel()
	dbURL, pool := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "#")
	late := testkit.UniqueName("outboxrelay_late")
	r := startRelay(t, relayEnv(dbURL, exchange, "OUTBOX_MAX_ATTEMPTS=1", "OUTBOX_POLL_INTERVAL=1h"))
	testkit.WaitFor(t, 30*time.Second, "the relay listening", func() bool {
		return testkit.ListenLocks(t, pool, notify.ListenLockClass) == 1
	})

	var id int64
	var eventID string
	require.NoError(t, pool.QueryRow(context.Background(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, exchange)
		VALUES ('order', '42', 'created', '{"n": 1}', $1) RETURNING id, event_id::text`, late).Scan(&id, &eventID))
	testkit.WaitFor(t, 30*time.Second, "the event dead-lettered", func() bool {
		return testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE id = $1 AND status = 'failed'`, id) == 1
	})
	var dead []deadOut
	runJSON(t, adminEnv(dbURL), &dead, "dead")
	require.Len(t, dead, 1)
	require.Equal(t, id, dead[0].ID)
	require.Equal(t, 1, dead[0].Attempts)
	require.Contains(t, *dead[0].LastError, late)

	queue.BindNew(t, late, "#")
	start := time.Now()
	var rq requeueOut
	runJSON(t, adminEnv(dbURL), &rq, "requeue", "--id", strconv.FormatInt(id, 10))
	require.Equal(t, requeueOut{Matched: 1, Requeued: 1, IDs: []int64{id}, Missing: []int64{}}, rq)
	requeued := time.Now()
	d := queue.Receive(t, 1, 15*time.Second)[0]
	t.Logf("arrived %s after requeue started, %s after it ended", time.Since(start), time.Since(requeued))
	require.Equal(t, eventID, d.MessageId)
	require.Equal(t, late, d.Exchange)
	testkit.WaitFor(t, 30*time.Second, "the event marked published", func() bool {
		return testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE id = $1 AND status = 'published' AND attempts = 1`, id) == 1
	})
	r.Stop(60 * time.Second)
}

func TestRequeueCommand(t *testing.T) {
	t.Parallel()
	dbURL, pool := testkit.NewOutbox(t)
	env := adminEnv(dbURL, "OUTBOX_CHANNEL=admin requeue")
	seedOutbox(t, pool, [][3]string{
		{"failed", "1", "created"},
		{"failed", "2", "paid"},
		{"pending", "3", "paid"},
		{"failed", "4", "paid"},
		{"published", "5", "created"},
	})
	idOf := func(aggregateID string) int64 {
		return testkit.QueryInt(t, pool, `SELECT id FROM outbox WHERE aggregate_id = $1`, aggregateID)
	}

	for _, args := range [][]string{{"requeue"}, {"requeue", "--all", "--event-type=paid"}, {"requeue", "--id=1", "--all"}} {
		code, stdout, stderr := runOnce(t, env, args...)
		require.Equal(t, 2, code, args)
		require.Empty(t, stdout)
		require.Contains(t, stderr, "choose exactly one of --id, --event-type or --all")
	}

	const snapshot = `SELECT hashtext(string_agg(o::text, ',' ORDER BY id)) FROM outbox o`
	before := testkit.QueryInt(t, pool, snapshot)
	var rq requeueOut
	runJSON(t, env, &rq, "requeue", "--all", "--dry-run")
	require.True(t, rq.DryRun)
	require.Equal(t, int64(3), rq.Matched)
	require.Zero(t, rq.Requeued)
	require.Equal(t, []int64{idOf("1"), idOf("2"), idOf("4")}, rq.IDs)
	require.Len(t, rq.Events, 3)
	require.Equal(t, "boom paid", *rq.Events[1].LastError)
	code, stdout, stderr := runOnce(t, env, "requeue", "--event-type=paid", "--dry-run")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "would requeue 2 events (dry run: nothing changed)")
	require.Contains(t, stdout, "order/4")
	require.Equal(t, before, testkit.QueryInt(t, pool, snapshot), "a dry run changes nothing")

	listener, err := pgx.Connect(context.Background(), dbURL)
	require.NoError(t, err)
	defer listener.Close(context.Background())
	_, err = listener.Exec(context.Background(), `LISTEN "admin requeue"`)
	require.NoError(t, err)

	code, stdout, stderr = runOnce(t, env, "requeue", "--event-type=paid")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "requeued 2 events\n", stdout)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := listener.WaitForNotification(ctx)
	require.NoError(t, err, "requeue notifies the relay's channel")
	require.Equal(t, "admin requeue", n.Channel)
	require.Equal(t, int64(2), testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE event_type = 'paid' AND aggregate_id IN ('2', '4')
		AND status = 'pending' AND attempts = 0 AND lease_id IS NULL AND available_at <= now() AND last_error = 'boom paid'`),
		"requeued: attempts reset, due now, the last error kept")

	// An id that names no dead-lettered event is reported, not an error.
	rq = requeueOut{}
	runJSON(t, env, &rq, "requeue", "--id", strconv.FormatInt(idOf("3"), 10), "--id", strconv.FormatInt(idOf("1"), 10), "--id=999999")
	require.Equal(t, requeueOut{Matched: 1, Requeued: 1, IDs: []int64{idOf("1")}, Missing: []int64{idOf("3"), 999999}}, rq)
	code, stdout, stderr = runOnce(t, env, "requeue", "--all")
	require.Equal(t, 0, code, "nothing left to requeue is no failure")
	require.Equal(t, "requeued 0 events\n", stdout)
	require.Empty(t, stderr)
	require.Zero(t, testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE status = 'failed'`))
}
