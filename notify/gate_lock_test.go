package notify

// The gate lock's requests: queued behind producers or another relay,
// failed in the background, withdrawn by Open or by a failed Close.

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// Two relays: the second one's Close finds the gate held by the first and
// returns, its request waiting; when the first opens the gate, the second
// takes it, and the trigger stays silent throughout.
func TestSecondRelayTakesTheGateWhenTheFirstOpensIt(t *testing.T) {
	t.Parallel()
	e := newGateEnv(t, time.Hour)
	ctx := context.Background()
	second, err := NewGate(e.pool, "outbox", pgx.Identifier{"public", "outbox"}, pgx.Identifier{"public", "outbox_wakeup"}, time.Hour)
	require.NoError(t, err)
	defer func() { require.NoError(t, second.Open(ctx)) }()

	e.close(t)
	require.NoError(t, second.Close(ctx), "the gate held by another relay is closed all the same")
	testkit.WaitFor(t, eventTimeout, "the second relay's request to wait", func() bool {
		return gateWaiters(t, e.pool) == 1
	})
	testkit.Exec(t, e.pool, insertOne)

	require.NoError(t, e.gate.Open(ctx))
	testkit.WaitFor(t, eventTimeout, "the second relay to hold the gate", func() bool {
		return gateHolders(t, e.pool) == 1
	})
	testkit.Exec(t, e.pool, insertOne)
	e.marker(t, "second holds")
	require.Equal(t, "second holds", e.next(t), "an insert notified while a relay held or requested the gate")
	require.NoError(t, second.Close(ctx), "refreshing the held gate")
}

// A producer that found the gate open keeps its lock shared until it
// commits, however long that takes. Close does not wait for it: its
// request queues behind the producer, and a queued request already makes
// every new producer's try fail.
func TestCloseQueuedBehindAnOpenGatesProducerSilencesTheTrigger(t *testing.T) {
	t.Parallel()
	e := newGateEnv(t, time.Hour)
	ctx := context.Background()
	producer := e.producer(t)

	e.closeQueued(t, e.gate)
	testkit.Exec(t, e.pool, insertOne)
	e.marker(t, "queued")
	require.Equal(t, "queued", e.next(t), "an insert notified while Close's request was queued")

	require.NoError(t, producer.Commit(ctx))
	require.Equal(t, "", e.next(t), "the producer that found the gate open did not notify")
	e.awaitHeld(t)
}

// A request for the lock that fails in the background (its backend
// terminated while it waits behind a producer) is reported by the next
// Close, which has made it again: the gate stays closed throughout.
func TestCloseMakesAFailedRequestAgain(t *testing.T) {
	t.Parallel()
	e := newGateEnv(t, time.Hour)
	ctx := context.Background()
	producer := e.producer(t)
	e.closeQueued(t, e.gate)
	require.EqualValues(t, 1, testkit.QueryInt(t, e.pool, "SELECT count(pg_terminate_backend(pid)) "+testkit.GateLocksSQL, GateLockClass, false))
	testkit.WaitFor(t, eventTimeout, "the request to end with its backend", func() bool {
		return gateWaiters(t, e.pool) == 0
	})

	// The request's outcome reaches the gate through a channel: Close
	// reports it once it has arrived.
	var err error
	testkit.WaitFor(t, eventTimeout, "Close to report the failed request", func() bool {
		err = e.gate.Close(ctx)
		return err != nil
	})
	require.ErrorContains(t, err, "was made again")
	testkit.WaitFor(t, eventTimeout, "the new request to queue behind the producer", func() bool {
		return gateWaiters(t, e.pool) == 1
	})
	require.NoError(t, producer.Commit(ctx))
	e.awaitHeld(t)
}

// Open withdraws a request still queued behind a producer (a relay that
// goes idle, or stops, while its Close waits) and returns only once the
// server has taken it out of the lock's queue: pgx cancels a statement cut
// off by its context in the background, over a connection of its own, and
// until that cancel arrives the request silences the trigger. Here the
// gate's connections are slow to dial, as over a slow network, and the
// producer outlasts Open's deadline.
func TestOpenWithdrawsAQueuedRequestFromTheServer(t *testing.T) {
	t.Parallel()
	e := newGateEnv(t, time.Hour)
	ctx := context.Background()
	const slowDial = 400 * time.Millisecond // well within cutWait
	var slow atomic.Bool
	config, err := pgxpool.ParseConfig(e.url)
	require.NoError(t, err)
	dialer := &net.Dialer{}
	config.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if slow.Load() {
			select {
			case <-time.After(slowDial):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return dialer.DialContext(ctx, network, addr)
	}
	pool, err := pgxpool.NewWithConfig(ctx, config)
	require.NoError(t, err)
	defer pool.Close()
	// Connections for the request and for Open's statements, dialed now.
	var conns []*pgxpool.Conn
	for range 3 {
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	gate, err := NewGate(pool, "outbox", pgx.Identifier{"public", "outbox"}, pgx.Identifier{"public", "outbox_wakeup"}, time.Hour)
	require.NoError(t, err)
	producer := e.producer(t)
	e.closeQueued(t, gate)

	slow.Store(true)
	openCtx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, gate.Open(openCtx), context.DeadlineExceeded, "Open's deadline passed with the producer in flight")
	require.Zero(t, gateWaiters(t, e.pool), "Open returned with its withdrawn request still waiting for the gate lock")
	testkit.Exec(t, e.pool, insertOne)
	require.Equal(t, "", e.next(t), "an insert after Open did not notify")
	require.NoError(t, producer.Rollback(ctx))
	require.Zero(t, gateHolders(t, e.pool), "the withdrawn request took the gate lock once the producer ended")
}

// A Close that fails reports the gate open, and leaves it open: a relay
// that takes it for open waits for notifications. Close withdraws its
// request for the lock, on the server too, before it returns.
func TestFailedCloseLeavesTheGateOpen(t *testing.T) {
	t.Parallel()
	e := newGateEnv(t, time.Hour)
	testkit.Exec(t, e.pool, "DROP SEQUENCE outbox_wakeup")
	require.Error(t, e.gate.Close(context.Background()))
	e.gate.mu.Lock()
	pending := e.gate.pending != nil || e.gate.held != nil
	e.gate.mu.Unlock()
	require.False(t, pending, "the failed Close left its request for the gate lock behind")
	require.Zero(t, gateHolders(t, e.pool)+gateWaiters(t, e.pool), "the failed Close's request holds or waits for the gate lock")
	testkit.Exec(t, e.pool, insertOne)
	require.Equal(t, "", e.next(t), "a failed Close silenced the trigger")
}
