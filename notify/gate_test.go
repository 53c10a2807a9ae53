package notify

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/testkit"
)

// gateEnv is a migrated outbox, a gate on it and a connection LISTENing on
// the outbox channel.
type gateEnv struct {
	pool   *pgxpool.Pool
	gate   *Gate
	listen *pgx.Conn
}

func newGateEnv(t *testing.T, ttl time.Duration) *gateEnv {
	t.Helper()
	url, pool := testkit.NewOutbox(t)
	gate, err := NewGate(pool, "outbox", pgx.Identifier{"public", "outbox_wakeup"}, ttl)
	require.NoError(t, err)
	require.NoError(t, gate.Check(context.Background()))
	conn, err := pgx.Connect(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	_, err = conn.Exec(context.Background(), "LISTEN outbox")
	require.NoError(t, err)
	return &gateEnv{pool: pool, gate: gate, listen: conn}
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

	require.NoError(t, e.gate.Close(ctx))
	testkit.Exec(t, e.pool, insertOne)
	testkit.Exec(t, e.pool, insertOne)
	e.marker(t, "after closed inserts")
	require.Equal(t, "after closed inserts", e.next(t), "a closed gate sent a notification")

	require.NoError(t, e.gate.Open(ctx))
	testkit.Exec(t, e.pool, insertOne)
	require.Equal(t, "", e.next(t), "the reopened gate did not notify")
}

func TestClosedGateExpiresAfterItsTTL(t *testing.T) {
	t.Parallel()
	e := newGateEnv(t, 300*time.Millisecond)
	require.NoError(t, e.gate.Close(context.Background()))
	testkit.Exec(t, e.pool, insertOne)
	e.marker(t, "closed")
	require.Equal(t, "closed", e.next(t))

	testkit.WaitFor(t, 10*time.Second, "the gate's deadline to pass by the database's clock", func() bool {
		return testkit.QueryInt(t, e.pool, `SELECT (pg_sequence_last_value('outbox_wakeup') < date_part('epoch', clock_timestamp()) * 1000)::int`) == 1
	})
	testkit.Exec(t, e.pool, insertOne)
	require.Equal(t, "", e.next(t), "an expired gate still silenced the trigger")
}

// The interleaving the barrier exists for: a producer reads the gate closed,
// the relay opens it and claims, and only then does the producer commit.
// Open must not return before that commit.
func TestGateOpenWaitsForProducersThatSawItClosed(t *testing.T) {
	t.Parallel()
	e := newGateEnv(t, time.Hour)
	ctx := context.Background()
	require.NoError(t, e.gate.Close(ctx))

	producer, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer producer.Rollback(ctx) //nolint:errcheck // committed below
	_, err = producer.Exec(ctx, insertOne)
	require.NoError(t, err)

	opened := make(chan error, 1)
	go func() { opened <- e.gate.Open(ctx) }()
	testkit.WaitFor(t, eventTimeout, "Open to wait for the producer's gate lock", func() bool {
		return testkit.QueryInt(t, e.pool, `SELECT count(*) FROM pg_locks
			WHERE locktype = 'advisory' AND classid = $1 AND NOT granted`, GateLockClass) == 1
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

// The gate is a sequence, outside MVCC: a REPEATABLE READ producer whose
// snapshot predates Open still sees the gate open.
func TestRepeatableReadProducerSeesTheGateOpen(t *testing.T) {
	t.Parallel()
	e := newGateEnv(t, time.Hour)
	ctx := context.Background()
	require.NoError(t, e.gate.Close(ctx))

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

func TestTriggerFailsOpenWithoutTheGateSequence(t *testing.T) {
	t.Parallel()
	e := newGateEnv(t, time.Hour)
	require.NoError(t, e.gate.Close(context.Background()))
	testkit.Exec(t, e.pool, "DROP SEQUENCE outbox_wakeup")
	testkit.Exec(t, e.pool, insertOne)
	require.Equal(t, "", e.next(t), "without its gate the trigger must notify")
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
	require.NoError(t, e.gate.Close(ctx))

	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	_, err = tx.Exec(ctx, "SET LOCAL ROLE "+pgx.Identifier{role}.Sanitize())
	require.NoError(t, err)
	_, err = tx.Exec(ctx, insertOne)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
}

// The trigger function is written out twice, in the migration and in the
// drop-in script, and the lock class a third time in Go: all must agree.
func TestTriggerFunctionsAgreeWithTheGate(t *testing.T) {
	class := strconv.Itoa(GateLockClass)
	require.Contains(t, gateBarrierSQL, "("+class+",")
	var bodies []string
	for _, path := range []string{"../migrations/002_wakeup_gate.sql", "../sql/outboxrelay_install.sql"} {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		_, body, ok := strings.Cut(string(b), "IF TG_NARGS > 1")
		require.True(t, ok, "%s has no gated trigger function", path)
		body, _, ok = strings.Cut(body, "PERFORM pg_notify(TG_ARGV[0], '');")
		require.True(t, ok, path)
		require.Contains(t, body, "pg_try_advisory_xact_lock_shared("+class+", hashtext(TG_ARGV[0]))", path)
		bodies = append(bodies, strings.Join(strings.Fields(body), " "))
	}
	require.Equal(t, bodies[0], bodies[1], "the migration's and the drop-in's trigger functions differ")
}

func TestNewGateRejectsBadNames(t *testing.T) {
	for _, tc := range []struct {
		channel string
		seq     pgx.Identifier
		ttl     time.Duration
	}{
		{"", pgx.Identifier{"s"}, 0},
		{strings.Repeat("c", 64), pgx.Identifier{"s"}, 0},
		{"outbox", nil, 0},
		{"outbox", pgx.Identifier{"a", "b", "c"}, 0},
		{"outbox", pgx.Identifier{"public", ""}, 0},
		{"outbox", pgx.Identifier{"s"}, -time.Second},
	} {
		_, err := NewGate(nil, tc.channel, tc.seq, tc.ttl)
		require.Error(t, err, "%+v", tc)
	}
}
