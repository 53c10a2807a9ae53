package relay_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/relay"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/notify"
)

// These tests run the relay with its fallback poll an hour away: an event
// that arrives within the test's deadline was found by a notification or by
// the claim that follows the gate's opening, never by the poll.

// gateValue is the gate sequence's raw value: 0 when a relay opened it.
const gateValueSQL = `SELECT pg_sequence_last_value('outbox_wakeup')`

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
	return options{relay: relay.Config{PollInterval: time.Hour, BusyRate: 200}}
}

func TestBusyRelayClosesTheGateAndReopensItWhenIdle(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start(t, busyRelay())
	stop := burst(t, e)
	defer stop()
	waitGateClosed(t, e)
	n := stop()
	testkit.WaitFor(t, 30*time.Second, "the idle relay to open the gate", func() bool {
		return testkit.QueryInt(t, e.pool, gateValueSQL) == 0
	})
	testkit.Exec(t, e.pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', '1', 'after', '{}')`)

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
// stay are woken by notifications again.
func TestStoppingBusyRelayLeavesTheGateOpen(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	busy := e.start(t, busyRelay())
	stop := burst(t, e)
	defer stop()
	waitGateClosed(t, e)
	require.NoError(t, busy.stop(t))
	require.EqualValues(t, 0, testkit.QueryInt(t, e.pool, gateValueSQL), "the stopped relay left the gate closed")
	n := stop()

	// A relay that is never busy relies on notifications alone.
	e.start(t, options{relay: relay.Config{PollInterval: time.Hour, BusyRate: 1e9}})
	testkit.Exec(t, e.pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', '1', 'after', '{}')`)
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
