package admin_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/admin"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// newAdmin is a migrated outbox of its own and an Admin on it.
func newAdmin(t *testing.T, cfg claim.Config) (*admin.Admin, *pgxpool.Pool, string) {
	t.Helper()
	url, pool := testkit.NewOutbox(t)
	a, err := admin.New(pool, cfg)
	require.NoError(t, err)
	return a, pool, url
}

// seed inserts one event per row of rows: status, aggregate type, aggregate
// id, event type; every event is created one minute after the one before,
// the last one now.
func seed(t *testing.T, pool *pgxpool.Pool, rows [][4]string) {
	t.Helper()
	for i, r := range rows {
		testkit.Exec(t, pool, `INSERT INTO outbox (status, aggregate_type, aggregate_id, event_type, payload,
				attempts, last_error, created_at, available_at)
			VALUES ($1, $2, $3, $4, '{}', CASE WHEN $1 = 'failed' THEN 25 ELSE 0 END,
				CASE WHEN $1 = 'failed' THEN 'boom ' || $4 END, now() - $5 * interval '1 minute', now() - $5 * interval '1 minute')`,
			r[0], r[1], r[2], r[3], len(rows)-1-i)
	}
}

func TestStatusCountsEventsAndAgesTheOldestPending(t *testing.T) {
	t.Parallel()
	a, pool, _ := newAdmin(t, claim.Config{})
	ctx := context.Background()

	s, err := a.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, admin.Status{FailedByEventType: []admin.EventTypeCount{}}, s, "an empty outbox")

	seed(t, pool, [][4]string{
		{"pending", "order", "1", "created"}, // 6 minutes old
		{"published", "order", "2", "created"},
		{"failed", "order", "3", "shipped"},
		{"failed", "order", "4", "created"},
		{"failed", "order", "5", "shipped"},
		{"pending", "order", "6", "created"},
		{"pending", "order", "7", "created"},
	})
	// One pending event in flight, one waiting for its retry.
	testkit.Exec(t, pool, `UPDATE outbox SET lease_id = gen_random_uuid(), available_at = now() + interval '30 seconds' WHERE aggregate_id = '6'`)
	testkit.Exec(t, pool, `UPDATE outbox SET attempts = 2, available_at = now() + interval '1 minute' WHERE aggregate_id = '7'`)

	s, err = a.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(3), s.Pending)
	require.Equal(t, int64(1), s.Published)
	require.Equal(t, int64(3), s.Failed)
	require.Equal(t, int64(1), s.InFlight)
	require.Equal(t, int64(1), s.Retrying)
	require.NotNil(t, s.OldestPending)
	require.InDelta(t, 6*time.Minute, *s.OldestPending, float64(time.Minute))
	require.Equal(t, []admin.EventTypeCount{{"shipped", 2}, {"created", 1}}, s.FailedByEventType)
	require.Nil(t, s.Blocked, "blocked aggregates are an ordered mode's")
	require.Zero(t, s.Scheduled)

	// A scheduled event, written an hour ago for an hour from now, is
	// neither retrying nor the oldest; one that fell due 2 minutes ago
	// (written 20 minutes ago) is aged from its time.
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at, available_at)
		VALUES ('reminder', '1', 'due', '{}', now() - interval '1 hour', now() + interval '1 hour')`)
	s, err = a.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(4), s.Pending)
	require.Equal(t, int64(1), s.Scheduled)
	require.Equal(t, int64(1), s.Retrying, "the scheduled event is not retrying")
	require.InDelta(t, 6*time.Minute, *s.OldestPending, float64(time.Minute), "the scheduled event is not the oldest")
	testkit.Exec(t, pool, `DELETE FROM outbox WHERE status = 'pending' AND aggregate_type = 'order'`)
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at, available_at)
		VALUES ('reminder', '2', 'due', '{}', now() - interval '20 minutes', now() - interval '2 minutes')`)
	s, err = a.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(2), s.Pending)
	require.NotNil(t, s.OldestPending)
	require.InDelta(t, 2*time.Minute, *s.OldestPending, float64(30*time.Second), "a scheduled event is late from its time")
}

// In ordered mode under the block policy an aggregate whose first pending
// or failed event is failed is blocked; one whose failed event comes after
// a pending one is not (its head is pending).
func TestStatusFindsBlockedAggregates(t *testing.T) {
	t.Parallel()
	a, pool, _ := newAdmin(t, claim.Config{Ordering: claim.OrderAggregate})
	seed(t, pool, [][4]string{
		{"published", "order", "A", "created"},
		{"failed", "order", "A", "paid"}, // A's head: blocked, two waiting
		{"pending", "order", "A", "shipped"},
		{"failed", "order", "A", "shipped"},
		{"pending", "order", "A", "delivered"},
		{"pending", "order", "B", "created"}, // B's head is pending
		{"failed", "order", "B", "paid"},
		{"failed", "invoice", "A", "sent"}, // another aggregate of id A: blocked, none waiting
	})
	s, err := a.Status(context.Background())
	require.NoError(t, err)
	require.NotNil(t, s.Blocked)
	require.Equal(t, int64(2), s.Blocked.Aggregates)
	require.Equal(t, int64(2), s.Blocked.Waiting)
	require.Len(t, s.Blocked.First, 2)
	first := s.Blocked.First[0]
	require.Equal(t, []string{"order", "A"}, []string{*first.Key[0], *first.Key[1]})
	require.Equal(t, "paid", first.EventType)
	require.Equal(t, int64(2), first.Waiting)
	require.Equal(t, testkit.QueryInt(t, pool, `SELECT id FROM outbox WHERE event_type = 'paid' AND aggregate_id = 'A'`), first.FailedID)
	require.Equal(t, "invoice", *s.Blocked.First[1].Key[0])

	cont, err := admin.New(pool, claim.Config{Ordering: claim.OrderAggregate, OrderedDeadLetter: claim.DeadLetterContinue})
	require.NoError(t, err)
	s, err = cont.Status(context.Background())
	require.NoError(t, err)
	require.Nil(t, s.Blocked, "under continue nothing is blocked")
}

func TestDeadFilters(t *testing.T) {
	t.Parallel()
	a, pool, _ := newAdmin(t, claim.Config{})
	seed(t, pool, [][4]string{
		{"failed", "order", "1", "created"}, // 5 minutes old
		{"failed", "order", "2", "shipped"},
		{"pending", "order", "3", "created"},
		{"failed", "invoice", "1", "created"},
		{"failed", "order", "1", "shipped"},
		{"published", "order", "1", "created"},
	})
	testkit.Exec(t, pool, `UPDATE outbox SET exchange = 'elsewhere', routing_key = 'rk' WHERE aggregate_type = 'invoice'`)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		filter admin.DeadFilter
		want   []string // aggregate type/id:event type
		total  int64
	}{
		{"all", admin.DeadFilter{}, []string{"order/1:created", "order/2:shipped", "invoice/1:created", "order/1:shipped"}, 4},
		{"event type", admin.DeadFilter{EventType: "shipped"}, []string{"order/2:shipped", "order/1:shipped"}, 2},
		{"aggregate", admin.DeadFilter{AggregateType: "order", AggregateID: "1"}, []string{"order/1:created", "order/1:shipped"}, 2},
		{"aggregate type", admin.DeadFilter{AggregateType: "invoice"}, []string{"invoice/1:created"}, 1},
		{"older than", admin.DeadFilter{OlderThan: 3*time.Minute + 30*time.Second}, []string{"order/1:created", "order/2:shipped"}, 2},
		{"limit", admin.DeadFilter{Limit: 1}, []string{"order/1:created"}, 4},
		{"nothing", admin.DeadFilter{EventType: "nope"}, []string{}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			list, err := a.Dead(ctx, tc.filter)
			require.NoError(t, err)
			got := []string{}
			for _, e := range list.Events {
				got = append(got, e.AggregateType+"/"+e.AggregateID+":"+e.EventType)
				require.Equal(t, 25, e.Attempts)
				require.Equal(t, "boom "+e.EventType, *e.LastError)
				require.NotEmpty(t, e.EventID)
				require.WithinDuration(t, time.Now(), e.CreatedAt, 10*time.Minute)
			}
			require.Equal(t, tc.want, got)
			require.Equal(t, tc.total, list.Total)
		})
	}
	list, err := a.Dead(ctx, admin.DeadFilter{AggregateType: "invoice"})
	require.NoError(t, err)
	require.Equal(t, "elsewhere", *list.Events[0].Exchange)
	require.Equal(t, "rk", *list.Events[0].RoutingKey)
}

func TestSelectorWantsExactlyOneChoice(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		sel admin.Selector
		ok  bool
	}{
		{admin.Selector{}, false},
		{admin.Selector{IDs: []int64{1}}, true},
		{admin.Selector{EventType: "x"}, true},
		{admin.Selector{All: true}, true},
		{admin.Selector{IDs: []int64{1}, All: true}, false},
		{admin.Selector{EventType: "x", All: true}, false},
		{admin.Selector{IDs: []int64{1}, EventType: "x"}, false},
	} {
		if tc.ok {
			require.NoError(t, tc.sel.Validate(), "%+v", tc.sel)
		} else {
			require.ErrorIs(t, tc.sel.Validate(), admin.ErrSelector, "%+v", tc.sel)
		}
	}
}

// Requeue resets the selected dead-lettered events, leaves the rest, and
// notifies the channel when (and only when) it requeued something.
func TestRequeueResetsSelectedEventsAndNotifies(t *testing.T) {
	t.Parallel()
	a, pool, url := newAdmin(t, claim.Config{})
	seed(t, pool, [][4]string{
		{"failed", "order", "1", "created"},
		{"failed", "order", "2", "shipped"},
		{"failed", "order", "3", "shipped"},
		{"pending", "order", "4", "shipped"},
		{"failed", "order", "5", "paid"},
	})
	ctx := context.Background()
	listener, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer listener.Close(ctx)
	_, err = listener.Exec(ctx, `LISTEN "admin test"`)
	require.NoError(t, err)
	opt := admin.RequeueOptions{Channel: "admin test"}
	id := func(aggregateID string) int64 {
		return testkit.QueryInt(t, pool, `SELECT id FROM outbox WHERE aggregate_id = $1`, aggregateID)
	}

	res, err := a.Requeue(ctx, admin.Selector{EventType: "shipped"}, opt)
	require.NoError(t, err)
	require.Equal(t, []int64{id("2"), id("3")}, res.IDs)
	require.Empty(t, res.Missing)
	require.Nil(t, res.Events)
	awaitNotification(t, listener, "admin test")
	require.Equal(t, int64(2), testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE event_type = 'shipped'
		AND status = 'pending' AND attempts = 0 AND lease_id IS NULL AND available_at <= now() AND last_error = 'boom shipped'
		AND aggregate_id IN ('2', '3')`), "reset, with the last error kept")

	res, err = a.Requeue(ctx, admin.Selector{IDs: []int64{id("1"), id("4"), 999999}}, opt)
	require.NoError(t, err)
	require.Equal(t, []int64{id("1")}, res.IDs)
	require.Equal(t, []int64{id("4"), 999999}, res.Missing, "a pending event and an absent one are not requeued")
	awaitNotification(t, listener, "admin test")

	res, err = a.Requeue(ctx, admin.Selector{EventType: "nope"}, opt)
	require.NoError(t, err)
	require.Empty(t, res.IDs)
	res, err = a.Requeue(ctx, admin.Selector{All: true}, opt)
	require.NoError(t, err)
	require.Equal(t, []int64{id("5")}, res.IDs)
	// Had the empty requeue notified, this would be its notification; the
	// next one must come from the last requeue, and be the only one.
	awaitNotification(t, listener, "admin test")
	noNotification(t, listener)
	require.Zero(t, testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE status = 'failed'`))

	_, err = a.Requeue(ctx, admin.Selector{}, opt)
	require.ErrorIs(t, err, admin.ErrSelector)
}

func TestRequeueDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	a, pool, _ := newAdmin(t, claim.Config{})
	seed(t, pool, [][4]string{
		{"failed", "order", "1", "created"},
		{"pending", "order", "2", "created"},
		{"failed", "order", "3", "shipped"},
	})
	const snapshot = `SELECT hashtext(string_agg(o::text, ',' ORDER BY id)) FROM outbox o`
	before := testkit.QueryInt(t, pool, snapshot)
	res, err := a.Requeue(context.Background(), admin.Selector{All: true}, admin.RequeueOptions{DryRun: true})
	require.NoError(t, err)
	require.Len(t, res.Events, 2)
	require.Equal(t, []int64{res.Events[0].ID, res.Events[1].ID}, res.IDs)
	require.Equal(t, "created", res.Events[0].EventType)
	require.Equal(t, 25, res.Events[1].Attempts)
	require.Equal(t, before, testkit.QueryInt(t, pool, snapshot))
}

func awaitNotification(t *testing.T, conn *pgx.Conn, channel string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := conn.WaitForNotification(ctx)
	require.NoError(t, err)
	require.Equal(t, channel, n.Channel)
}

// noNotification checks that no notification is waiting: notifications of
// committed transactions are delivered in commit order, so a barrier
// NOTIFY sent now arrives after any earlier one.
func noNotification(t *testing.T, conn *pgx.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := conn.Exec(ctx, `LISTEN barrier; NOTIFY barrier`)
	require.NoError(t, err)
	n, err := conn.WaitForNotification(ctx)
	require.NoError(t, err)
	require.Equal(t, "barrier", n.Channel, "an unexpected notification")
}
