package notify

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
	tablewriters "github.com/outboxrelay/outboxrelay/internal/writers"
)

// gateEnv is a migrated outbox, a gate on it and a connection LISTENing on
// the outbox channel and holding its listen lock, as a relay's listener
// does.
type gateEnv struct {
	url    string
	pool   *pgxpool.Pool
	gate   *Gate
	listen *pgx.Conn
}

func newGateEnv(t *testing.T, ttl time.Duration) *gateEnv {
	t.Helper()
	url, pool := testkit.NewOutbox(t)
	gate, err := NewGate(pool, "outbox", pgx.Identifier{"public", "outbox"}, pgx.Identifier{"public", "outbox_wakeup"}, ttl)
	require.NoError(t, err)
	require.NoError(t, gate.Check(context.Background()))
	// A closed gate holds a connection of the pool, which Close would wait for.
	t.Cleanup(func() { _ = gate.Open(context.Background()) })
	conn, err := pgx.Connect(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	testkit.ListenAsRelay(t, conn, ListenLockClass, "outbox")
	return &gateEnv{url: url, pool: pool, gate: gate, listen: conn}
}

const insertOne = `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', '1', 'created', '{}')`

// next returns the payload of the next notification on the outbox channel.
func (e *gateEnv) next(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), eventTimeout)
	defer cancel()
	n, err := e.listen.WaitForNotification(ctx)
	require.NoError(t, err, "no notification")
	return n.Payload
}

// close closes the gate and waits until its lock is granted: Close
// returns once the request is on its way.
func (e *gateEnv) close(t *testing.T) {
	t.Helper()
	require.NoError(t, e.gate.Close(context.Background()))
	e.awaitHeld(t)
}

// closeQueued closes gate (e.gate, or another on the same table) while a
// producer holds its lock shared, and waits until Close's request is queued
// behind it.
func (e *gateEnv) closeQueued(t *testing.T, gate *Gate) {
	t.Helper()
	require.NoError(t, gate.Close(context.Background()))
	testkit.WaitFor(t, eventTimeout, "Close's request to queue behind the producer", func() bool {
		return gateWaiters(t, e.pool) == 1
	})
}

// awaitHeld waits until a session holds the gate lock.
func (e *gateEnv) awaitHeld(t *testing.T) {
	t.Helper()
	testkit.WaitFor(t, eventTimeout, "the gate lock to be granted", func() bool {
		return gateHolders(t, e.pool) == 1
	})
}

// producer begins a transaction that inserts one event and stays open; it
// rolls back at the end of the test unless committed.
func (e *gateEnv) producer(t *testing.T) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, insertOne)
	require.NoError(t, err)
	return tx
}

// marker sends a notification with payload p after everything before it, so
// that a test can prove no notification came first without waiting for one.
func (e *gateEnv) marker(t *testing.T, p string) {
	t.Helper()
	testkit.Exec(t, e.pool, "SELECT pg_notify('outbox', $1)", p)
}

func TestGateSilencesTheTriggerOnlyWhileClosed(t *testing.T) {
	t.Parallel()
	e := newGateEnv(t, time.Hour)
	ctx := context.Background()

	testkit.Exec(t, e.pool, insertOne)
	require.Equal(t, "", e.next(t), "a fresh gate is open: the insert notifies")

	e.close(t)
	require.EqualValues(t, 1, testkit.QueryInt(t, e.pool, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = $1 AND state = 'idle in transaction'`,
		GateApplicationName), "the gate's session does not name itself")
	testkit.Exec(t, e.pool, insertOne)
	testkit.Exec(t, e.pool, insertOne)
	e.marker(t, "after closed inserts")
	require.Equal(t, "after closed inserts", e.next(t), "a closed gate sent a notification")

	require.NoError(t, e.gate.Open(ctx))
	testkit.Exec(t, e.pool, insertOne)
	require.Equal(t, "", e.next(t), "the reopened gate did not notify")
}

// A closed gate costs a producer one failed try of the lock in the
// trigger's WHEN clause and nothing more: PostgreSQL queues no trigger
// event and calls no trigger function. An open gate calls the function,
// which notifies.
func TestClosedGateCallsNoTriggerFunction(t *testing.T) {
	t.Parallel()
	e := newGateEnv(t, time.Hour)
	e.close(t)
	require.EqualValues(t, 0, testkit.TriggerCalls(t, e.pool, insertOne), "a closed gate ran the trigger function")
	require.NoError(t, e.gate.Open(context.Background()))
	require.EqualValues(t, 1, testkit.TriggerCalls(t, e.pool, insertOne), "an open gate did not run the trigger function")
	require.Equal(t, "", e.next(t), "the open gate's insert did not notify")
}

// A relay that stops refreshing its closed gate has the server end the
// transaction holding it after TTL, and the trigger notifies again; the
// next Close takes the gate again. The TTL leaves the test time to see
// the gate closed, on a loaded machine too.
func TestClosedGateExpiresAfterItsTTL(t *testing.T) {
	t.Parallel()
	e := newGateEnv(t, 2*time.Second)
	e.close(t)
	testkit.Exec(t, e.pool, insertOne)
	e.marker(t, "closed")
	require.Equal(t, "closed", e.next(t))

	testkit.WaitFor(t, 10*time.Second, "the server to end the gate's idle transaction", func() bool {
		return gateHolders(t, e.pool) == 0
	})
	testkit.Exec(t, e.pool, insertOne)
	require.Equal(t, "", e.next(t), "an expired gate still silenced the trigger")

	e.close(t)
	require.EqualValues(t, 1, gateHolders(t, e.pool), "Close after the expiry did not take the gate again")
	testkit.Exec(t, e.pool, insertOne)
	e.marker(t, "closed again")
	require.Equal(t, "closed again", e.next(t))
}

// A relay that dies holding the gate releases it with its connection, long
// before TTL.
func TestGateOfAnEndedSessionIsOpen(t *testing.T) {
	t.Parallel()
	e := newGateEnv(t, time.Hour)
	e.close(t)
	require.EqualValues(t, 1, testkit.QueryInt(t, e.pool, "SELECT count(pg_terminate_backend(pid)) "+testkit.GateLocksSQL, GateLockClass, true))
	testkit.WaitFor(t, 10*time.Second, "the killed session to release the gate", func() bool {
		return gateHolders(t, e.pool) == 0
	})
	testkit.Exec(t, e.pool, insertOne)
	require.Equal(t, "", e.next(t), "a gate whose session ended still silenced the trigger")
}

// gateHolders counts the sessions holding the gate lock.
func gateHolders(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	return testkit.GateLocks(t, pool, GateLockClass, true)
}

// gateWaiters counts the requests waiting for the gate lock.
func gateWaiters(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	return testkit.GateLocks(t, pool, GateLockClass, false)
}

// openWaiting reports whether Open has looked, at least once, for the
// producers it waits for: the last statement of one of the database's
// sessions is that look.
func openWaiting(t *testing.T, pool *pgxpool.Pool) bool {
	t.Helper()
	return testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND query = $1`, tablewriters.SQL) > 0
}

// With the gate closed a producer pays one failed try of the gate lock: its
// transaction keeps no advisory lock and no lock on the gate sequence, as
// the trigger of earlier versions did (a shared advisory lock to its
// commit, and the sequence read under an exclusive buffer lock).
func TestClosedGateLeavesProducersHoldingNothing(t *testing.T) {
	t.Parallel()
	e := newGateEnv(t, time.Hour)
	ctx := context.Background()
	e.close(t)

	producer := e.producer(t)
	var advisory, sequence int
	require.NoError(t, producer.QueryRow(ctx, `SELECT
		count(*) FILTER (WHERE locktype = 'advisory'),
		count(*) FILTER (WHERE locktype = 'relation' AND relation = 'outbox_wakeup'::regclass)
		FROM pg_locks WHERE pid = pg_backend_pid()`).Scan(&advisory, &sequence))
	require.Zero(t, advisory, "the producer holds an advisory lock")
	require.Zero(t, sequence, "the producer read the gate sequence")
	require.NoError(t, producer.Commit(ctx))
	e.marker(t, "after the producer")
	require.Equal(t, "after the producer", e.next(t), "the producer notified through a closed gate")
}

// A trigger of an earlier version reads the gate sequence, which Close and
// Open still set.
func TestGateSilencesTheTriggerOfEarlierVersions(t *testing.T) {
	t.Parallel()
	e := newGateEnv(t, time.Hour)
	ctx := context.Background()
	old, err := os.ReadFile("../migrations/002_wakeup_gate.sql")
	require.NoError(t, err)
	fn, _, ok := strings.Cut(string(old), "-- The trigger names the gate")
	require.True(t, ok)
	_, fn, ok = strings.Cut(fn, "GRANT SELECT ON SEQUENCE outbox_wakeup TO PUBLIC;")
	require.True(t, ok)
	testkit.Exec(t, e.pool, fn)

	e.close(t)
	testkit.Exec(t, e.pool, insertOne)
	e.marker(t, "closed")
	require.Equal(t, "closed", e.next(t), "the earlier trigger notified through a closed gate")
	require.NoError(t, e.gate.Open(ctx))
	testkit.Exec(t, e.pool, insertOne)
	require.Equal(t, "", e.next(t), "the earlier trigger stayed silent after Open")
}

// The interleaving the barrier exists for: a producer reads the gate closed,
// the relay opens it and claims, and only then does the producer commit.
// Open must not return before that commit.
func TestGateOpenWaitsForProducersThatSawItClosed(t *testing.T) {
	t.Parallel()
	e := newGateEnv(t, time.Hour)
	ctx := context.Background()
	e.close(t)

	producer := e.producer(t)

	opened := make(chan error, 1)
	go func() { opened <- e.gate.Open(ctx) }()
	testkit.WaitFor(t, eventTimeout, "Open to look for the producer in flight", func() bool {
		return openWaiting(t, e.pool)
	})
	select {
	case err := <-opened:
		t.Fatalf("Open returned (%v) while a producer that saw the gate closed was still running", err)
	default:
	}

	// Meanwhile other producers neither wait nor stay silent.
	testkit.Exec(t, e.pool, insertOne)
	require.Equal(t, "", e.next(t), "a producer during Open's wait did not notify")

	require.NoError(t, producer.Commit(ctx))
	select {
	case err := <-opened:
		require.NoError(t, err)
	case <-time.After(eventTimeout):
		t.Fatal("Open did not return after the producer committed")
	}
	require.EqualValues(t, 2, testkit.QueryInt(t, e.pool, "SELECT count(*) FROM outbox"),
		"a claim after Open sees the silent producer's event")
}

// The gate is a lock, outside MVCC: a REPEATABLE READ producer whose
// snapshot predates Open still finds the gate open.
func TestRepeatableReadProducerSeesTheGateOpen(t *testing.T) {
	t.Parallel()
	e := newGateEnv(t, time.Hour)
	ctx := context.Background()
	e.close(t)

	producer, err := e.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	defer producer.Rollback(ctx)                               //nolint:errcheck // committed below
	_, err = producer.Exec(ctx, "SELECT count(*) FROM outbox") // takes the snapshot
	require.NoError(t, err)

	require.NoError(t, e.gate.Open(ctx))
	_, err = producer.Exec(ctx, insertOne)
	require.NoError(t, err)
	require.NoError(t, producer.Commit(ctx))
	require.Equal(t, "", e.next(t), "the producer read a stale closed gate")
}

// A trigger created without the gate argument (as the first migration
// did) notifies whatever the gate; a relay without the gate sequence runs
// without a gate (Check fails).
func TestTriggerWithoutTheGateNotifies(t *testing.T) {
	t.Parallel()
	e := newGateEnv(t, time.Hour)
	e.close(t)
	testkit.Exec(t, e.pool, `CREATE OR REPLACE TRIGGER outbox_notify AFTER INSERT ON outbox
		FOR EACH STATEMENT EXECUTE FUNCTION outboxrelay_notify('outbox')`)
	testkit.Exec(t, e.pool, insertOne)
	require.Equal(t, "", e.next(t), "without its gate the trigger must notify")
	testkit.Exec(t, e.pool, "DROP SEQUENCE outbox_wakeup")
	require.Error(t, e.gate.Check(context.Background()))
}

// A producer role with nothing but INSERT on the outbox can read the gate.
func TestProducerWithoutPrivilegesPassesTheGate(t *testing.T) {
	t.Parallel()
	e := newGateEnv(t, time.Hour)
	ctx := context.Background()
	role := testkit.UniqueName("producer")
	testkit.Exec(t, e.pool, "CREATE ROLE "+pgx.Identifier{role}.Sanitize())
	t.Cleanup(func() {
		testkit.Exec(t, e.pool, "DROP OWNED BY "+pgx.Identifier{role}.Sanitize())
		testkit.Exec(t, e.pool, "DROP ROLE "+pgx.Identifier{role}.Sanitize())
	})
	testkit.Exec(t, e.pool, "GRANT INSERT ON outbox TO "+pgx.Identifier{role}.Sanitize())
	e.close(t)

	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	_, err = tx.Exec(ctx, "SET LOCAL ROLE "+pgx.Identifier{role}.Sanitize())
	require.NoError(t, err)
	_, err = tx.Exec(ctx, insertOne)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
}

func TestNewGateRejectsBadNames(t *testing.T) {
	table := pgx.Identifier{"outbox"}
	for _, tc := range []struct {
		channel    string
		table, seq pgx.Identifier
		ttl        time.Duration
	}{
		{"", table, pgx.Identifier{"s"}, 0},
		{strings.Repeat("c", 64), table, pgx.Identifier{"s"}, 0},
		{"outbox", table, nil, 0},
		{"outbox", table, pgx.Identifier{"a", "b", "c"}, 0},
		{"outbox", table, pgx.Identifier{"public", ""}, 0},
		{"outbox", nil, pgx.Identifier{"s"}, 0},
		{"outbox", pgx.Identifier{"", "outbox"}, pgx.Identifier{"s"}, 0},
		{"outbox", table, pgx.Identifier{"s"}, -time.Second},
	} {
		_, err := NewGate(nil, tc.channel, tc.table, tc.seq, tc.ttl)
		require.Error(t, err, "%+v", tc)
	}
}
