package relay_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/relay"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/notify"
)

// These tests run the relay with its fallback poll an hour away: an event
// that arrives within the test's deadline was found by a notification or by
// the claim that follows the gate's opening, never by the poll.
//
// The gate is the advisory lock a busy relay holds, which the current
// trigger tries in its WHEN clause; the gate sequence is only for triggers
// of earlier versions. So the tests look at the lock (pg_locks) and at what
// the trigger does, and the busy relay's gate has a TTL longer than any
// test: a lock the relay failed to release would outlive the test instead
// of expiring unseen after the default 2 s.

// gateTTL outlasts every test here.
const gateTTL = 10 * time.Minute

// insertAfter is the event a test inserts once the gate should be open.
const insertAfter = `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', '1', 'after', '{}')`

// burst inserts 20 events every 5ms (about 4,000 a second) until stop is
// called, which returns how many it inserted.
func burst(t *testing.T, e *env) (stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var (
		wg sync.WaitGroup
		n  int
	)
	wg.Go(func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if _, err := e.pool.Exec(context.Background(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
				SELECT 'order', i::text, 'burst', '{}' FROM generate_series(1, 20) i`); err != nil {
				t.Errorf("burst insert: %v", err)
				return
			}
			n += 20
		}
	})
	var once sync.Once
	return func() int {
		once.Do(func() { cancel(); wg.Wait() })
		return n
	}
}

func busyRelay() options {
	return options{relay: relay.Config{PollInterval: time.Hour, BusyRate: 200}, gateTTL: gateTTL}
}

// A busy relay closes the gate, the trigger's WHEN clause then skips the
// trigger, and once the producers stop the idle relay releases the lock
// and the trigger runs again, for the relay's listener.
func TestBusyRelayClosesTheGateAndReopensItWhenIdle(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start(t, busyRelay())
	stop := burst(t, e)
	defer stop()
	waitGateClosed(t, e)
	require.EqualValues(t, 0, testkit.TriggerCalls(t, e.pool, insertAfter), "the trigger ran through the closed gate")
	n := stop() + 1
	testkit.WaitFor(t, 30*time.Second, "the idle relay to release the gate's lock", func() bool {
		return gateLockHeldOrAsked(t, e) == 0
	})
	require.EqualValues(t, 1, testkit.TriggerCalls(t, e.pool, insertAfter), "the trigger stayed silent once the gate opened")

	seen := testkit.Counter{}
	seen.Add(e.queue.Receive(t, n+1, 60*time.Second))
	seen.Add(e.queue.Drain(t, 30*time.Second))
	require.Equal(t, n+1, len(seen), "every event, the one after the burst included, arrives without the poll")
	require.Zero(t, seen.Duplicates())
}

// The interleaving the gate's barrier exists for: a producer inserts while
// the gate is closed (so its trigger stays silent), the relay goes idle and
// opens the gate, and only then does the producer commit.
func TestSilentProducerCommittingAfterTheGateOpensIsNotLeftForThePoll(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start(t, busyRelay())
	stop := burst(t, e)
	defer stop()
	waitGateClosed(t, e)

	ctx := context.Background()
	producer, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer producer.Rollback(ctx) //nolint:errcheck // committed below
	_, err = producer.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'silent', 'late', '{}')`)
	require.NoError(t, err)
	require.EqualValues(t, 1, testkit.GateLocks(t, e.pool, notify.GateLockClass, true), "the producer's trigger ran with the gate closed")

	n := stop()
	testkit.WaitFor(t, 30*time.Second, "the idle relay to wait in Open for the silent producer", func() bool {
		return testkit.QueryInt(t, e.pool, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()
			  AND query LIKE '%virtualtransaction = ANY%'`) > 0
	})
	seen := testkit.Counter{}
	seen.Add(e.queue.Receive(t, n, 60*time.Second))
	require.NoError(t, producer.Commit(ctx))

	late := e.queue.Receive(t, 1, 30*time.Second)
	require.Equal(t, "late", late[0].Type)
	seen.Add(late)
	seen.Add(e.queue.Drain(t, 30*time.Second))
	require.Equal(t, n+1, len(seen))
	require.Zero(t, seen.Duplicates())
}

// A relay shutting down with the gate closed opens it, so the relays that
// stay are woken by notifications again. The producers keep inserting
// while it stops, so it stops busy, the gate closed, rather than going
// idle first and opening the gate as any idle relay does; and by the time
// Run has returned the gate's lock must be gone, not left to its TTL.
func TestStoppingBusyRelayLeavesTheGateOpen(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	busy := e.start(t, busyRelay())
	stop := burst(t, e)
	defer stop()
	waitGateClosed(t, e)
	require.NoError(t, busy.stop(t))
	require.Zero(t, gateLockHeldOrAsked(t, e), "the stopped relay left the gate's lock held (or asked for)")
	n := stop()

	// A relay that stays listens: with its listen lock held (here by the
	// test, as its listener would), the trigger runs, and notifies it.
	conn, err := pgx.Connect(context.Background(), e.url)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	testkit.ListenAsRelay(t, conn, notify.ListenLockClass, "outbox")
	require.EqualValues(t, 1, testkit.TriggerCalls(t, e.pool, insertAfter), "the trigger stayed silent after the busy relay stopped")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = conn.WaitForNotification(ctx)
	require.NoError(t, err, "no notification for the insert after the busy relay stopped")

	// Nothing inserted while the gate was closed is lost: a relay started
	// now publishes it all.
	e.start(t, options{relay: relay.Config{PollInterval: time.Hour, BusyRate: 1e9}})
	seen := testkit.Counter{}
	for len(seen) < n+1 {
		seen.Add(e.queue.Receive(t, 1, 60*time.Second))
	}
	require.Equal(t, n+1, len(seen))
}

func waitGateClosed(t *testing.T, e *env) {
	t.Helper()
	testkit.WaitFor(t, 30*time.Second, "the busy relay to close the gate", func() bool {
		return testkit.GateLocks(t, e.pool, notify.GateLockClass, true) == 1
	})
}

// gateLockHeldOrAsked counts the sessions holding the gate's lock or
// waiting for it: either silences the trigger.
func gateLockHeldOrAsked(t *testing.T, e *env) int64 {
	t.Helper()
	return testkit.GateLocks(t, e.pool, notify.GateLockClass, true) + testkit.GateLocks(t, e.pool, notify.GateLockClass, false)
}
