package notify

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// listenLockHolders lists the backends holding the listen lock of the
// outbox channel in pool's database.
func listenLockHolders(t *testing.T, pool *pgxpool.Pool) []int64 {
	t.Helper()
	var pids []int64
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT coalesce(array_agg(pid), '{}') FROM pg_locks
		WHERE locktype = 'advisory' AND classid = $1 AND objid = hashtext('outbox')::oid AND objsubid = 2
		  AND mode = 'ExclusiveLock' AND granted
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, ListenLockClass).Scan(&pids))
	return pids
}

// rawListener is a connection LISTENing on the outbox channel that does
// not take the listen lock: it sees the notifications producers send, and
// causes none.
func rawListener(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	_, err = conn.Exec(context.Background(), "LISTEN outbox")
	require.NoError(t, err)
	return conn
}

// nextOnOutbox returns true if the next notification on conn is on the
// outbox channel, false if it is the barrier NOTIFY sent after everything
// committed before: notifications arrive in commit order.
func nextOnOutbox(t *testing.T, conn *pgx.Conn) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), eventTimeout)
	defer cancel()
	_, err := conn.Exec(ctx, "LISTEN barrier; NOTIFY barrier")
	require.NoError(t, err)
	n, err := conn.WaitForNotification(ctx)
	require.NoError(t, err)
	if n.Channel == "outbox" {
		// Leave the barrier's own notification for nobody.
		_, err := conn.WaitForNotification(ctx)
		require.NoError(t, err)
		return true
	}
	return false
}

// The trigger notifies only while a listener holds the listen lock: with
// none running an insert queues no trigger event and sends nothing; a
// running Listener holds the lock on its listening connection and the
// insert notifies; once the Listener stops, its lock goes with its
// session and inserts are silent again.
func TestTriggerNotifiesOnlyWhileAListenerHoldsTheLock(t *testing.T) {
	t.Parallel()
	url, pool := testkit.NewOutbox(t)
	raw := rawListener(t, url)

	require.Zero(t, testkit.TriggerCalls(t, pool, insertOne), "no relay listens: the trigger function ran")
	require.False(t, nextOnOutbox(t, raw), "no relay listens: the insert notified")

	ctx, cancel := context.WithCancel(context.Background())
	l, err := New(Config{ConnConfig: parseConfig(t, url), Pinger: pool})
	require.NoError(t, err)
	var pid atomic.Uint32 // set by the listener's goroutine
	l.onListening = func(p uint32) { pid.Store(p) }
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	defer func() { cancel(); <-done }()
	testkit.WaitFor(t, eventTimeout, "the listener to listen, holding the listen lock", func() bool {
		return l.HoldsListenLock() && pid.Load() != 0
	})
	require.Equal(t, []int64{int64(pid.Load())}, listenLockHolders(t, pool), "the listening connection holds the lock")
	for len(l.C()) > 0 {
		<-l.C()
	}

	require.Equal(t, int64(1), testkit.TriggerCalls(t, pool, insertOne))
	require.True(t, nextOnOutbox(t, raw), "a relay listens: the insert did not notify")
	select {
	case <-l.C():
	case <-time.After(eventTimeout):
		t.Fatal("the listener was not woken by the insert")
	}

	cancel()
	require.NoError(t, <-done)
	done <- nil
	testkit.WaitFor(t, eventTimeout, "the stopped listener's lock to go", func() bool {
		return len(listenLockHolders(t, pool)) == 0
	})
	require.Zero(t, testkit.TriggerCalls(t, pool, insertOne))
	require.False(t, nextOnOutbox(t, raw), "the relay stopped: the insert notified")
}

// A producer that found no relay listening keeps the listen lock shared to
// its commit, so a listener that starts meanwhile does not take the lock
// (nor, therefore, signal the wake-up that follows it) before that
// producer ends: the claim the wake-up causes sees the producer's event.
func TestListenerTakesTheLockOnlyAfterProducersThatDidNotNotify(t *testing.T) {
	t.Parallel()
	url, pool := testkit.NewOutbox(t)
	producer, err := pool.Begin(context.Background())
	require.NoError(t, err)
	defer producer.Rollback(context.Background()) //nolint:errcheck // committed below
	_, err = producer.Exec(context.Background(), insertOne)
	require.NoError(t, err)

	h := start(t, Config{ConnConfig: parseConfig(t, url), Channel: "outbox", Pinger: pool})
	h.awaitListening(t)
	h.drain()
	// The listener retries every second (its heartbeat) and waits up to
	// listenLockWait each time: see it wait once.
	testkit.WaitFor(t, eventTimeout, "the listener to wait for the lock", func() bool {
		return testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
			AND classid = $1 AND NOT granted`, ListenLockClass) == 1
	})
	require.False(t, h.l.HoldsListenLock())
	h.drain()

	require.NoError(t, producer.Commit(context.Background()))
	h.awaitWake(t, "the lock taken after the producer committed")
	require.True(t, h.l.HoldsListenLock())
	require.Equal(t, int64(1), testkit.TriggerCalls(t, pool, insertOne))
}

// One listener of a channel holds the listen lock; when it stops (its
// relay shut down or died), another takes it over within a heartbeat or
// so, and the trigger keeps notifying.
func TestListenLockPassesToAnotherListener(t *testing.T) {
	t.Parallel()
	url, pool := testkit.NewOutbox(t)
	a := start(t, Config{ConnConfig: parseConfig(t, url), Channel: "outbox", Pinger: pool})
	a.awaitListening(t)
	testkit.WaitFor(t, eventTimeout, "A to take the listen lock", a.l.HoldsListenLock)
	b := start(t, Config{ConnConfig: parseConfig(t, url), Channel: "outbox", Pinger: pool})
	b.awaitListening(t)
	require.False(t, b.l.HoldsListenLock(), "two listeners hold the lock")
	require.Len(t, listenLockHolders(t, pool), 1)

	a.stop()
	testkit.WaitFor(t, eventTimeout, "B to take the listen lock over", b.l.HoldsListenLock)
	require.Len(t, listenLockHolders(t, pool), 1)
	require.Equal(t, int64(1), testkit.TriggerCalls(t, pool, insertOne))
}
