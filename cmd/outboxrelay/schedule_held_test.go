package main_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/outbox"
)

// The tests of this file hold a scheduled event X in an open transaction
// past its time, beside an event Z due at the same moment that nothing
// holds, with the relay's fallback poll an hour away: a due event is to be
// published at its time, or as soon as whatever held it ends, whatever
// another transaction does to another row. The bounds are a second: far
// above the tens of milliseconds these take, far below the seconds the
// relay used to take (until an unrelated insert or the fallback poll woke
// it).

// heldSchedule is a running relay, the consumer's queue and a producer
// pool, with what reached the queue and when.
type heldSchedule struct {
	pool    *pgxpool.Pool
	queue   *testkit.Queue
	relay   *testkit.Process
	arrived map[string]time.Time
}

func newHeldSchedule(t *testing.T, ordering string) *heldSchedule {
	t.Helper()
	dbURL, pool := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "#")
	p := startedRelay(t, relayEnv(dbURL, exchange), "--poll-interval=1h", "--ordering="+ordering)
	h := &heldSchedule{pool: pool, queue: queue, relay: p, arrived: map[string]time.Time{}}
	// An event published proves the relay's start-up over, and with it the
	// opening of its gate, which waits for the transactions writing to the
	// table at its start (a transaction a test holds would delay the
	// start-up's claim to its end, and hide what the test looks at).
	ids, err := outbox.Writer{}.Write(t.Context(), pool, outbox.Event{AggregateType: "cart", AggregateID: "w", EventType: "created", Payload: 0})
	require.NoError(t, err)
	h.await(t, ids[0], 30*time.Second)
	return h
}

// scheduleXZ writes two events due at the same moment, 3 s ahead: after
// the one extra claim the relay's idle reading of the id sequence makes
// for new ids (within 2 s), so that only a wake-up for their time can
// publish them then.
func (h *heldSchedule) scheduleXZ(t *testing.T) (x, z string, due time.Time) {
	t.Helper()
	due = time.Now().Add(3 * time.Second)
	ids, err := outbox.Writer{}.Write(t.Context(), h.pool,
		outbox.Event{AggregateType: "cart", AggregateID: "x", EventType: "expired", Payload: 1, NotBefore: due},
		outbox.Event{AggregateType: "cart", AggregateID: "z", EventType: "expired", Payload: 2, NotBefore: due})
	require.NoError(t, err)
	return ids[0], ids[1], due
}

// holdOutboxLock begins the transaction that will hold X, and has it take
// the outbox's ROW EXCLUSIVE lock at once, as the DELETE of a Cancel does:
// it cancels an event that is gone already (Cancel counts 0). In the issue
// the application's Cancel of X came soon after X was written, before the
// relay had read X; taking the lock before X is written makes that order
// certain.
func (h *heldSchedule) holdOutboxLock(t *testing.T) pgx.Tx {
	t.Helper()
	tx, err := h.pool.Begin(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { tx.Rollback(t.Context()) })
	cancelled, err := outbox.Writer{}.Cancel(t.Context(), tx, "0190a5a4-7f3c-7000-8000-000000000001")
	require.NoError(t, err)
	require.Empty(t, cancelled)
	return tx
}

// receiveUntil records the deliveries that arrive until the deadline: the
// time a transaction is held open.
func (h *heldSchedule) receiveUntil(t *testing.T, deadline time.Time) {
	t.Helper()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		select {
		case d := <-h.queue.Deliveries:
			h.arrived[d.MessageId] = time.Now()
		case <-h.relay.Done():
			t.Fatalf("the relay exited: %v", h.relay.Err())
		case <-timer.C:
			return
		}
	}
}

// await returns when the event arrived, receiving until it does.
func (h *heldSchedule) await(t *testing.T, id string, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		if at, ok := h.arrived[id]; ok {
			return at
		}
		select {
		case d := <-h.queue.Deliveries:
			h.arrived[d.MessageId] = time.Now()
		case <-h.relay.Done():
			t.Fatalf("the relay exited: %v", h.relay.Err())
		case <-deadline.C:
			t.Fatalf("event %s did not arrive within %s", id, timeout)
		}
	}
}

// forEachOrdering runs f in parallel subtests, unordered and ordered.
func forEachOrdering(t *testing.T, f func(t *testing.T, ordering string)) {
	for _, ordering := range []string{"none", "aggregate"} {
		t.Run(ordering, func(t *testing.T) {
			t.Parallel()
			f(t, ordering)
		})
	}
}

// A Cancel of X held open 1.5 s past X's time and then rolled back: X is
// published soon after the rollback, not at the next insert or poll.
func TestCancelHeldPastTheTimeThenRolledBackPublishesAtTheRollback(t *testing.T) {
	t.Parallel()
	forEachOrdering(t, testCancelHeldPastTheTime)
}

func testCancelHeldPastTheTime(t *testing.T, ordering string) {
	h := newHeldSchedule(t, ordering)
	tx := h.holdOutboxLock(t)
	x, _, due := h.scheduleXZ(t)
	cancelled, err := outbox.Writer{}.Cancel(t.Context(), tx, x)
	require.NoError(t, err)
	require.Equal(t, []string{x}, cancelled)

	h.receiveUntil(t, due.Add(1500*time.Millisecond))
	require.NotContains(t, h.arrived, x, "X arrived while its Cancel was open")
	require.NoError(t, tx.Rollback(t.Context()))
	released := time.Now()
	at := h.await(t, x, 30*time.Second)
	t.Logf("X arrived %s after the rollback", at.Sub(released))
	require.Less(t, at.Sub(released), time.Second, "X arrived long after the rollback: the relay did not look at it again")
	h.relay.Stop(60 * time.Second)
}

// Z, due at the same moment as X and untouched, is published at its time
// while X's Cancel is held open.
func TestEventDueBesideAHeldCancelArrivesOnTime(t *testing.T) {
	t.Parallel()
	forEachOrdering(t, testEventDueBesideAHeldCancel)
}

func testEventDueBesideAHeldCancel(t *testing.T, ordering string) {
	h := newHeldSchedule(t, ordering)
	tx := h.holdOutboxLock(t)
	x, z, due := h.scheduleXZ(t)
	cancelled, err := outbox.Writer{}.Cancel(t.Context(), tx, x)
	require.NoError(t, err)
	require.Equal(t, []string{x}, cancelled)

	h.receiveUntil(t, due.Add(1500*time.Millisecond))
	at, ok := h.arrived[z]
	require.True(t, ok, "Z did not arrive in the 1.5 s after its time while X's Cancel was held")
	t.Logf("Z arrived %s after its time", at.Sub(due))
	require.False(t, at.Before(due), "Z arrived %s before its time", due.Sub(at))
	require.Less(t, at.Sub(due), time.Second, "Z arrived long after its time")
	require.NoError(t, tx.Rollback(t.Context()))
	h.relay.Stop(60 * time.Second)
}

// X held by SELECT … FOR UPDATE past its time: Z goes at its time, and X
// soon after the lock is released.
func TestEventLockedPastTheTimeArrivesAtTheRelease(t *testing.T) {
	t.Parallel()
	h := newHeldSchedule(t, "none")
	x, z, due := h.scheduleXZ(t)
	tx, err := h.pool.Begin(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { tx.Rollback(t.Context()) })
	_, err = tx.Exec(t.Context(), `SELECT 1 FROM outbox WHERE event_id = $1 FOR UPDATE`, x)
	require.NoError(t, err)

	h.receiveUntil(t, due.Add(1500*time.Millisecond))
	require.NotContains(t, h.arrived, x, "X arrived while it was locked")
	at, ok := h.arrived[z]
	require.True(t, ok, "Z did not arrive in the 1.5 s after its time while X was locked")
	require.Less(t, at.Sub(due), time.Second, "Z arrived long after its time")
	require.NoError(t, tx.Rollback(t.Context()))
	released := time.Now()
	atX := h.await(t, x, 30*time.Second)
	t.Logf("Z arrived %s after its time; X %s after the release", at.Sub(due), atX.Sub(released))
	require.Less(t, atX.Sub(released), time.Second, "X arrived long after the release")
	h.relay.Stop(60 * time.Second)
}

// A Cancel of X rolled back 0.5 s before X's time: X and Z are published
// at their time.
func TestCancelRolledBackBeforeTheTimeArrivesOnTime(t *testing.T) {
	t.Parallel()
	h := newHeldSchedule(t, "none")
	tx := h.holdOutboxLock(t)
	x, z, due := h.scheduleXZ(t)
	cancelled, err := outbox.Writer{}.Cancel(t.Context(), tx, x)
	require.NoError(t, err)
	require.Equal(t, []string{x}, cancelled)

	h.receiveUntil(t, due.Add(-500*time.Millisecond))
	require.NoError(t, tx.Rollback(t.Context()))
	for _, id := range []string{x, z} {
		at := h.await(t, id, 30*time.Second)
		t.Logf("%s arrived %s after its time", id, at.Sub(due))
		require.False(t, at.Before(due), "event %s arrived %s before its time", id, due.Sub(at))
		require.Less(t, at.Sub(due), time.Second, "event %s arrived long after its time", id)
	}
	h.relay.Stop(60 * time.Second)
}

// A slow business transaction that has written an event of its own and
// stays open past Z's time holds the claims' frontier below Z: Z is
// published at its time all the same, and the slow transaction's event as
// soon as it commits.
func TestEventDueWhileAnInsertStaysOpenArrivesOnTime(t *testing.T) {
	t.Parallel()
	forEachOrdering(t, func(t *testing.T, ordering string) {
		h := newHeldSchedule(t, ordering)
		slow, err := h.pool.Begin(t.Context())
		require.NoError(t, err)
		t.Cleanup(func() { slow.Rollback(t.Context()) })
		ids, err := outbox.Writer{}.Write(t.Context(), slow, outbox.Event{AggregateType: "order", AggregateID: "slow", EventType: "placed", Payload: 3})
		require.NoError(t, err)
		_, z, due := h.scheduleXZ(t)

		h.receiveUntil(t, due.Add(1500*time.Millisecond))
		at, ok := h.arrived[z]
		require.True(t, ok, "Z did not arrive in the 1.5 s after its time while an insert stayed open")
		require.False(t, at.Before(due), "Z arrived %s before its time", due.Sub(at))
		require.Less(t, at.Sub(due), time.Second, "Z arrived long after its time")
		require.NoError(t, slow.Commit(t.Context()))
		committed := time.Now()
		atSlow := h.await(t, ids[0], 30*time.Second)
		t.Logf("Z arrived %s after its time; the slow event %s after its commit", at.Sub(due), atSlow.Sub(committed))
		require.Less(t, atSlow.Sub(committed), time.Second, "the slow transaction's event arrived long after its commit")
		h.relay.Stop(60 * time.Second)
	})
}
