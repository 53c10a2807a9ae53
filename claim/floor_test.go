package claim_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// publishAll claims and marks every claimable event, as a relay would.
func publishAll(t *testing.T, s *claim.Store) (n int) {
	t.Helper()
	ctx := context.Background()
	for {
		b, err := s.Claim(ctx, 500)
		require.NoError(t, err)
		if len(b.Events) == 0 {
			return n
		}
		ids := make([]int64, len(b.Events))
		for i, e := range b.Events {
			ids[i] = e.ID
		}
		_, err = s.MarkPublished(ctx, ids)
		require.NoError(t, err)
		n += len(ids)
	}
}

// advanceTo calls Advance until the floor reaches want (its frontier
// needs the writers it saw to end, which takes another call).
func advanceTo(t *testing.T, s *claim.Store, want int64) {
	t.Helper()
	testkit.WaitFor(t, 10*time.Second, "the floor to rise", func() bool {
		require.NoError(t, s.Advance(context.Background()))
		return s.Floor() >= want
	})
	require.Equal(t, want, s.Floor())
}

// setupBackoff is the retry delay of a row a test parks: long enough for
// the test to publish the rows after it and raise the floor past it before
// it falls due, on a loaded machine too (once due, it holds the floor).
const setupBackoff = 3 * time.Second

// pin holds back vacuum's horizon as a pg_dump would: a REPEATABLE READ
// transaction that has read the outbox, open until the test ends.
func pin(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	tx, err := pool.Begin(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(context.Background(), "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
	require.NoError(t, err)
	_, err = tx.Exec(context.Background(), "SELECT count(*) FROM outbox")
	require.NoError(t, err)
}

// With vacuum held back, a claim from the head of the pending index reads
// the entries of every row published since; from the floor, which Advance
// moves past them, it reads a handful of pages, whatever was published.
func TestClaimFromTheFloorSkipsPublishedRowsVacuumCannotRemove(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	testkit.Exec(t, pool, `ALTER TABLE outbox SET (autovacuum_enabled = off)`)
	s, err := claim.New(pool, claim.Config{})
	require.NoError(t, err)
	pin(t, pool)
	for range 10 {
		testkit.InsertEvents(t, pool, 1000)
		publishAll(t, s)
	}
	advanceTo(t, s, 10000)
	testkit.InsertEvents(t, pool, 1)

	explain := "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + claim.Statements(s)["claim"]
	tx, err := pool.Begin(context.Background())
	require.NoError(t, err)
	defer tx.Rollback(context.Background()) //nolint:errcheck // only plans
	fromHead := buffers(t, planOf(t, tx, explain, 500, 30000, claim.LeaseID{}, 16<<20, 0, []int64{}))
	fromFloor := buffers(t, planOf(t, tx, explain, 500, 30000, claim.LeaseID{}, 16<<20, s.Floor(), []int64{}))
	t.Logf("buffers read by a claim: %d from the head, %d from the floor", fromHead, fromFloor)
	require.Greater(t, fromHead, 300, "from the head, the claim reads the dead rows' pages")
	require.Less(t, fromFloor, 30, "from the floor, it reads none of them")
}

// A producer that took an id and has not committed holds the frontier, and
// the floor, below that id, however many later events are published: once
// it commits, the next claim takes its event.
func TestFloorWaitsForAnOpenProducer(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	s, err := claim.New(pool, claim.Config{})
	require.NoError(t, err)
	late, err := pool.Begin(context.Background())
	require.NoError(t, err)
	defer late.Rollback(context.Background()) //nolint:errcheck // committed below
	testkit.InsertEvents(t, pool, 10)
	_, err = late.Exec(context.Background(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'late', 'created', '{}')`)
	require.NoError(t, err)
	for range 5 {
		testkit.InsertEvents(t, pool, 1000)
		publishAll(t, s)
	}
	for range 20 {
		require.NoError(t, s.Advance(context.Background()))
	}
	require.Less(t, s.Floor(), int64(11), "the floor passed the open producer's id")

	require.NoError(t, late.Commit(context.Background()))
	b, err := s.Claim(context.Background(), 500)
	require.NoError(t, err)
	require.Len(t, b.Events, 1)
	require.Equal(t, "late", b.Events[0].AggregateID)
	advanceTo(t, s, 5011)
}

// A row whose publish failed backs off below the floor: it is parked, and
// a claim takes it by its id once its retry is due, though the floor went
// past it.
func TestRetriedRowBelowTheFloorIsClaimedWhenDue(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	s, err := claim.New(pool, claim.Config{RetryMin: setupBackoff, RetryMax: setupBackoff, Jitter: func() float64 { return 0.5 }})
	require.NoError(t, err)
	ctx := context.Background()
	testkit.InsertEvents(t, pool, 1)
	b, err := s.Claim(ctx, 10)
	require.NoError(t, err)
	require.Len(t, b.Events, 1)
	failed := b.Events[0].ID
	_, err = s.Retry(ctx, b.Lease, []claim.Failure{{ID: failed, Attempts: 1, Err: context.DeadlineExceeded}})
	require.NoError(t, err)
	testkit.InsertEvents(t, pool, 100)
	require.Equal(t, 100, publishAll(t, s))
	advanceTo(t, s, 101)
	require.Equal(t, 1, s.Parked())

	testkit.WaitFor(t, 10*time.Second, "the retried row claimed when due", func() bool {
		require.NoError(t, s.Advance(ctx))
		b, err := s.Claim(ctx, 10)
		require.NoError(t, err)
		return len(b.Events) == 1 && b.Events[0].ID == failed
	})
	require.Zero(t, s.Parked())
}

// A claimer that dies leaves its rows leased: the floor waits a moment for
// it, then parks them and goes on; another store's claim takes them once
// their lease has expired.
func TestLeasedRowsOfADeadClaimerAreClaimedAfterTheirLease(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	dead, err := claim.New(pool, claim.Config{Lease: 2 * time.Second})
	require.NoError(t, err)
	s, err := claim.New(pool, claim.Config{})
	require.NoError(t, err)
	ctx := context.Background()
	testkit.InsertEvents(t, pool, 5)
	b, err := dead.Claim(ctx, 5)
	require.NoError(t, err)
	require.Len(t, b.Events, 5) // and never marked: its relay was killed
	testkit.InsertEvents(t, pool, 100)
	require.Equal(t, 100, publishAll(t, s))
	advanceTo(t, s, 105) // past the leased rows, once they held it for a second
	require.Equal(t, 5, s.Parked())

	got := map[int64]bool{}
	testkit.WaitFor(t, 20*time.Second, "the dead claimer's rows claimed after their lease", func() bool {
		require.NoError(t, s.Advance(ctx))
		b, err := s.Claim(ctx, 10)
		require.NoError(t, err)
		for _, e := range b.Events {
			got[e.ID] = true
		}
		return len(got) == 5
	})
	for _, e := range b.Events {
		require.True(t, got[e.ID], e.ID)
	}
}

// A dead claimer's lease can lapse before it has held the floor for a
// second: the relay that stays started late, or its floor came to the
// lease only after parking others before it. Nothing announces a lapse (no
// insert, no notification), and a relay that has claimed everything else
// waits for a notification, its fallback poll or a parked row's time: the
// floor parks the lapsed rows then, due at once, so that the relay is
// woken for them (ParkedDue) and claims them by id. The store's clock
// stands still here, so the lease never holds the floor for a second.
func TestLeaseLapsedBeforeItWasParkedIsParkedDueAtOnce(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	dead, err := claim.New(pool, claim.Config{Lease: time.Hour})
	require.NoError(t, err)
	start := time.Now()
	s, err := claim.New(pool, claim.Config{Now: func() time.Time { return start }})
	require.NoError(t, err)
	ctx := context.Background()
	testkit.InsertEvents(t, pool, 5)
	b, err := dead.Claim(ctx, 5)
	require.NoError(t, err)
	require.Len(t, b.Events, 5) // and never marked: its relay was killed
	testkit.InsertEvents(t, pool, 100)
	require.Equal(t, 100, publishAll(t, s))
	for range 3 {
		require.NoError(t, s.Advance(ctx))
	}
	require.Zero(t, s.Floor(), "the lease holds the floor")
	require.True(t, s.Unsettled(), "a leased row holds the floor: the relay keeps advancing")
	require.Zero(t, s.Parked())

	// The lease lapses: its relay is gone and nothing renews it.
	testkit.Exec(t, pool, `UPDATE outbox SET available_at = now() WHERE lease_id = $1`, b.Lease)
	require.NoError(t, s.Advance(ctx))
	due, parked := s.ParkedDue()
	require.True(t, parked, "the lapsed rows are claimable, and nothing tells the relay to claim them")
	require.Zero(t, due)
	require.Equal(t, 5, s.Parked())
	require.Equal(t, int64(105), s.Floor())

	got, err := s.Claim(ctx, 10)
	require.NoError(t, err)
	require.Len(t, got.Events, 5)
	for i, e := range got.Events {
		require.Equal(t, b.Events[i].ID, e.ID)
	}
	require.Zero(t, s.Parked())
}

// Dead letters requeued by hand are pending again below the floor, where
// claims do not look: a rescan sweeps below the floor and parks them, and
// the next claim takes them.
func TestRescanFindsRowsRequeuedBelowTheFloor(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	s, err := claim.New(pool, claim.Config{SweepInterval: -1})
	require.NoError(t, err)
	ctx := context.Background()
	testkit.InsertEvents(t, pool, 100)
	testkit.Exec(t, pool, `UPDATE outbox SET status = 'failed' WHERE id IN (7, 42)`)
	require.Equal(t, 98, publishAll(t, s))
	advanceTo(t, s, 100)
	testkit.Exec(t, pool, `UPDATE outbox SET status = 'pending', attempts = 0 WHERE status = 'failed'`)
	b, err := s.Claim(ctx, 10)
	require.NoError(t, err)
	require.Empty(t, b.Events, "claims look above the floor only")

	s.Rescan()
	require.NoError(t, s.Advance(ctx))
	require.Equal(t, 2, s.Parked())
	b, err = s.Claim(ctx, 10)
	require.NoError(t, err)
	require.Len(t, b.Events, 2)
	require.Equal(t, []int64{7, 42}, []int64{b.Events[0].ID, b.Events[1].ID})
}

// A sequence that goes back (the table emptied and its identity
// restarted) hands out ids at or below the floor again: the floor starts
// over.
func TestFloorStartsOverWhenTheSequenceGoesBack(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	s, err := claim.New(pool, claim.Config{})
	require.NoError(t, err)
	testkit.InsertEvents(t, pool, 100)
	publishAll(t, s)
	advanceTo(t, s, 100)
	testkit.Exec(t, pool, `TRUNCATE outbox RESTART IDENTITY`)
	testkit.InsertEvents(t, pool, 3)
	require.NoError(t, s.Advance(context.Background()))
	require.Zero(t, s.Floor())
	require.Equal(t, 3, publishAll(t, s))
}

// The table's gauges count what is pending without reading below the
// floor: the parked rows through the primary key, the rest above the
// floor; the oldest pending event may be a parked one.
func TestSampleCountsThePendingRowsAboveTheFloorAndParked(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	s, err := claim.New(pool, claim.Config{RetryMin: time.Hour, RetryMax: time.Hour})
	require.NoError(t, err)
	ctx := context.Background()
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at)
		VALUES ('order', 'old', 'created', '{}', now() - interval '1 hour')`)
	b, err := s.Claim(ctx, 1)
	require.NoError(t, err)
	_, err = s.Retry(ctx, b.Lease, []claim.Failure{{ID: b.Events[0].ID, Attempts: 1, Err: context.Canceled}})
	require.NoError(t, err)
	testkit.InsertEvents(t, pool, 100)
	publishAll(t, s)
	advanceTo(t, s, 101)
	require.Equal(t, 1, s.Parked())
	testkit.InsertEvents(t, pool, 5)

	got, err := s.Sample(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, int64(6), got.Pending, "five above the floor, one parked")
	require.Greater(t, got.OldestPending, 59*time.Minute, "the parked row is the oldest")
}

// A scheduled event waiting for its time, parked below the floor, is
// pending but not late: the oldest pending age leaves it out, so that a
// reminder due tomorrow does not raise OutboxEventsDelayed.
func TestSampleLeavesScheduledEventsOutOfTheOldestPending(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	s, err := claim.New(pool, claim.Config{})
	require.NoError(t, err)
	ctx := context.Background()
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at, available_at)
		VALUES ('reminder', '1', 'due', '{}', now() - interval '1 hour', now() + interval '1 day')`)
	testkit.InsertEvents(t, pool, 3)
	publishAll(t, s)
	advanceTo(t, s, 4)
	require.Equal(t, 1, s.Parked(), "the scheduled row is parked")

	got, err := s.Sample(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, int64(1), got.Pending)
	require.Equal(t, int64(1), got.Scheduled, "the parked row waits for its time")
	require.Zero(t, got.OldestPending, "nothing pending is due")

	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, available_at)
		VALUES ('reminder', '2', 'due', '{}', now() + interval '1 day')`)
	testkit.InsertEvents(t, pool, 1)
	got, err = s.Sample(ctx, nil)
	require.NoError(t, err)
	require.Equal(t, int64(3), got.Pending)
	require.Equal(t, int64(2), got.Scheduled, "one parked, one above the floor")
	require.Less(t, got.OldestPending, time.Minute, "the new event is the oldest due")
}

// Cleanup starts where it got to: rows it deleted earlier leave index
// entries vacuum cannot remove while a long transaction may see them, and
// the next pass reads none of them.
func TestCleanupStartsWhereItGotTo(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	testkit.Exec(t, pool, `ALTER TABLE outbox SET (autovacuum_enabled = off)`)
	s, err := claim.New(pool, claim.Config{})
	require.NoError(t, err)
	pin(t, pool)
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, status, published_at)
		SELECT 'order', i::text, 'created', '{}', 'published', now() - interval '2 days' + i * interval '1 second'
		FROM generate_series(1, 20000) AS i`)
	var total int64
	for {
		n, err := s.DeletePublished(context.Background(), 24*time.Hour, 1000)
		require.NoError(t, err)
		total += n
		if n < 1000 {
			break
		}
	}
	require.Equal(t, int64(20000), total)

	explain := "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + claim.Statements(s)["delete_published"]
	tx, err := pool.Begin(context.Background())
	require.NoError(t, err)
	defer tx.Rollback(context.Background()) //nolint:errcheck // only plans
	fromStart := buffers(t, planOf(t, tx, explain, 86400000, 1000, time.Time{}))
	fromCursor := buffers(t, planOf(t, tx, explain, 86400000, 1000, claim.CleanupFrom(s)))
	t.Logf("buffers read by cleanup: %d from the oldest row, %d from where it got to", fromStart, fromCursor)
	require.Greater(t, fromStart, 20*fromCursor)
}

// Ordered claims read from the floor too: with vacuum held back and every
// aggregate's earlier rows published, a claim reads a handful of pages
// from the floor, where from the head (the floor at 0) it walks every
// aggregate's published rows.
func TestOrderedClaimFromTheFloorSkipsPublishedRows(t *testing.T) {
	t.Parallel()
	s, pool := newOrderedStore(t, claim.Config{})
	testkit.Exec(t, pool, `ALTER TABLE outbox SET (autovacuum_enabled = off)`)
	pin(t, pool)
	for range 10 {
		insertAggregates(t, pool, 100, 10)
		publishAll(t, s)
	}
	advanceTo(t, s, 10000)
	insertAggregates(t, pool, 100, 1)

	explain := "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + claim.Statements(s)["claim"]
	tx, err := pool.Begin(context.Background())
	require.NoError(t, err)
	defer tx.Rollback(context.Background()) //nolint:errcheck // only plans
	fromHead := buffers(t, planOf(t, tx, explain, 500, 30000, claim.LeaseID{}, 16<<20, 0, 2000, []int64{}))
	fromFloor := buffers(t, planOf(t, tx, explain, 500, 30000, claim.LeaseID{}, 16<<20, s.Floor(), 2000, []int64{}))
	t.Logf("buffers read by an ordered claim: %d from the head, %d from the floor", fromHead, fromFloor)
	require.Greater(t, fromHead, 3*fromFloor)
}

// A parked row below the floor still heads its aggregate: while it backs
// off, the aggregate's later rows above the floor wait; once it is due, it
// goes first.
func TestParkedRowBelowTheFloorHoldsItsAggregateBack(t *testing.T) {
	t.Parallel()
	s, pool := newOrderedStore(t, claim.Config{RetryMin: setupBackoff, RetryMax: setupBackoff, Jitter: func() float64 { return 0.5 }})
	ctx := context.Background()
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'a', 'first', '{}')`)
	b, err := s.Claim(ctx, 10)
	require.NoError(t, err)
	require.Len(t, b.Events, 1)
	_, err = s.Retry(ctx, b.Lease, []claim.Failure{{ID: b.Events[0].ID, Attempts: 1, Err: context.Canceled}})
	require.NoError(t, err)
	insertAggregates(t, pool, 50, 2) // other aggregates, published past it
	publishAll(t, s)
	advanceTo(t, s, 101)
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'a', 'second', '{}')`)

	b, err = s.Claim(ctx, 10)
	require.NoError(t, err)
	require.Empty(t, b.Events, "the aggregate's second event went while its first backs off below the floor")
	var got []string
	testkit.WaitFor(t, 10*time.Second, "the aggregate's events, first then second", func() bool {
		b, err := s.Claim(ctx, 10)
		require.NoError(t, err)
		for _, e := range b.Events {
			got = append(got, e.EventType)
		}
		return len(got) >= 2
	})
	require.Equal(t, []string{"first", "second"}, got)
}

// A dead letter below the floor holds its aggregate back under the block
// policy, though the floor went past it (it is not pending): the failed
// rows' index by aggregate tells.
func TestDeadLetterBelowTheFloorHoldsItsAggregateBack(t *testing.T) {
	t.Parallel()
	s, pool := newOrderedStore(t, claim.Config{})
	ctx := context.Background()
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, status)
		VALUES ('order', 'a', 'dead', '{}', 'failed')`)
	insertAggregates(t, pool, 50, 2)
	publishAll(t, s)
	advanceTo(t, s, 101)
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'a', 'after', '{}')`)
	b, err := s.Claim(ctx, 10)
	require.NoError(t, err)
	require.Empty(t, b.Events, "an event went past its aggregate's dead letter")

	cont, err := claim.New(pool, claim.Config{Ordering: claim.OrderAggregate, OrderedDeadLetter: claim.DeadLetterContinue})
	require.NoError(t, err)
	b, err = cont.Claim(ctx, 10)
	require.NoError(t, err)
	require.Len(t, b.Events, 1, "under the continue policy a dead letter holds nothing back")
}

// A dead letter set back to pending (as requeue does, keeping its last
// error) lies below the floor, unparked until a rescan: under either
// policy, it holds back its aggregate's later rows above the floor
// meanwhile, and once the rescan parks it, it goes first.
func TestRequeuedDeadLetterBelowTheFloorHoldsItsAggregateBack(t *testing.T) {
	t.Parallel()
	for _, policy := range []claim.DeadLetterPolicy{claim.DeadLetterBlock, claim.DeadLetterContinue} {
		t.Run(string(policy), func(t *testing.T) {
			t.Parallel()
			s, pool := newOrderedStore(t, claim.Config{OrderedDeadLetter: policy})
			ctx := context.Background()
			var dead int64
			require.NoError(t, pool.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, status, attempts, last_error)
				VALUES ('order', 'a', 'first', '{}', 'failed', 25, 'exchange not found') RETURNING id`).Scan(&dead))
			insertAggregates(t, pool, 50, 2)
			publishAll(t, s)
			advanceTo(t, s, 101)
			testkit.Exec(t, pool, `UPDATE outbox SET status = 'pending', attempts = 0, available_at = now(), lease_id = NULL
				WHERE id = $1`, dead)
			testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'a', 'second', '{}')`)

			b, err := s.Claim(ctx, 10)
			require.NoError(t, err)
			require.Empty(t, b.Events, "the aggregate's second event went before its requeued first")

			s.Rescan()
			require.NoError(t, s.Advance(ctx))
			b, err = s.Claim(ctx, 10)
			require.NoError(t, err)
			got := []string{}
			for _, e := range b.Events {
				got = append(got, e.EventType)
			}
			require.Equal(t, []string{"first", "second"}, got)
		})
	}
}

// A parked head that a claim takes stays its aggregate's head while it is
// in flight: the store's next claim (another worker's) must not take the
// aggregate's later rows above the floor.
func TestClaimedParkedHeadHoldsItsAggregateWhileInFlight(t *testing.T) {
	t.Parallel()
	s, pool := newOrderedStore(t, claim.Config{RetryMin: setupBackoff, RetryMax: setupBackoff, Jitter: func() float64 { return 0.5 }})
	ctx := context.Background()
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'a', 'first', '{}')`)
	b, err := s.Claim(ctx, 10)
	require.NoError(t, err)
	_, err = s.Retry(ctx, b.Lease, []claim.Failure{{ID: b.Events[0].ID, Attempts: 1, Err: context.Canceled}})
	require.NoError(t, err)
	insertAggregates(t, pool, 50, 2)
	publishAll(t, s)
	advanceTo(t, s, 101)
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'a', 'second', '{}')`)

	var first claim.Batch
	testkit.WaitFor(t, 10*time.Second, "the parked head claimed when due", func() bool {
		first, err = s.Claim(ctx, 1)
		require.NoError(t, err)
		return len(first.Events) == 1
	})
	require.Equal(t, "first", first.Events[0].EventType)
	second, err := s.Claim(ctx, 10)
	require.NoError(t, err)
	require.Empty(t, second.Events, "the aggregate's second event was claimed while its first is in flight")
}

// The floor follows the frontier one advance behind: the advance that
// moves the frontier leaves the store Unsettled, so that a relay advances
// again without waiting for a claim, and the next raises the floor to it.
func TestFloorFollowsTheFrontierOneAdvanceBehind(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	s, err := claim.New(pool, claim.Config{})
	require.NoError(t, err)
	ctx := context.Background()
	testkit.InsertEvents(t, pool, 10)
	require.Equal(t, 10, publishAll(t, s))
	require.NoError(t, s.Advance(ctx))
	require.Zero(t, s.Floor(), "the rows were read before the frontier moved")
	require.True(t, s.Unsettled(), "the floor is behind the frontier")
	require.NoError(t, s.Advance(ctx))
	require.Equal(t, int64(10), s.Floor())
	require.False(t, s.Unsettled())
}
