package main_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/outbox"
)

// requireCleanLog fails on any error or warning a relay logged: behind
// PgBouncer, a prepared statement, a session setting or a lock that does not
// hold would show there first.
func requireCleanLog(t *testing.T, out string) {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		require.NotContains(t, line, `"level":"ERROR"`, out)
		require.NotContains(t, line, `"level":"WARN"`, out)
	}
}

// TestRelayBehindPgBouncer runs the relay as the user does: its
// pool through PgBouncer in transaction pooling, and only --listener-url
// direct. It migrates a fresh database through the listener URL, delivers
// events written through PgBouncer and woken by notifications (the
// fallback poll is an hour), closes
// and opens the gate under a burst, samples the table, cleans up, restarts,
// and the admin commands work through PgBouncer too. Nothing is logged at
// warning level or above.
func TestRelayBehindPgBouncer(t *testing.T) {
	t.Parallel()
	direct := testkit.NewDatabase(t)
	bouncer := testkit.NewPgBouncer(t, direct)
	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "#")
	env := relayEnv(bouncer, exchange,
		"OUTBOX_LISTENER_URL="+direct,
		"OUTBOX_POLL_INTERVAL=1h",
		"OUTBOX_BUSY_RATE=200",
		"OUTBOX_RETENTION=1ms",
		"OUTBOX_CLEANUP_INTERVAL=200ms",
		"OUTBOX_METRICS_SAMPLE_INTERVAL=100ms",
		"OUTBOX_LOG_LEVEL=debug")
	p := startRelay(t, env)
	addr := testkit.HTTPAddr(t, p.Out)
	require.JSONEq(t, `{"ready":true}`, testkit.AwaitStatus(t, addr, "/readyz", 200))
	pool := testkit.NewPool(t, direct)

	// Producers write through PgBouncer too: with the outbox library on a
	// pool left as pgx configures it (Write sends its statement unprepared),
	// and with plain inserts on a pool that prepares nothing.
	ctx := context.Background()
	appPool := testkit.NewPool(t, bouncer)
	cfg, err := pgxpool.ParseConfig(bouncer)
	require.NoError(t, err)
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	insertPool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(insertPool.Close)

	// One by one: every event is announced by its notification.
	seen := testkit.Counter{}
	for i := range 20 {
		require.NoError(t, pgx.BeginFunc(ctx, appPool, func(tx pgx.Tx) error {
			_, err := outbox.Writer{}.Write(ctx, tx, outbox.Event{
				AggregateType: "order", AggregateID: strconv.Itoa(i), EventType: "created", Payload: map[string]int{"n": i}})
			return err
		}))
		collect(t, queue, seen, len(seen)+1, 30*time.Second)
	}
	// A burst of small transactions, faster than --busy-rate, until the gate
	// closes (the relay then polls), and no more: it opens once the burst
	// is over. An idle relay samples the rate every IdleInsertsEvery, and
	// the rate spans its last few samples, so how many inserts that takes
	// depends on the machine's speed: the burst is bounded in time.
	burst, deadline := 0, time.Now().Add(30*time.Second)
	for !strings.Contains(p.Out.String(), "busy: gate closed") {
		require.True(t, time.Now().Before(deadline), "the gate never closed (%d inserts)", burst)
		testkit.InsertEvents(t, insertPool, 10)
		burst += 10
	}
	total := len(seen) + burst
	collect(t, queue, seen, total, 60*time.Second)
	testkit.WaitFor(t, 30*time.Second, "the gate to open again", func() bool {
		out := p.Out.String()
		return strings.Contains(out[strings.Index(out, "busy: gate closed"):], "idle: gate open")
	})
	testkit.WaitFor(t, 30*time.Second, "cleanup to delete every published event", func() bool {
		return testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox`) == 0
	})
	testkit.AwaitMetrics(t, addr, 30*time.Second, "the table sampled", func(m testkit.Metrics) bool {
		return m.Value("outboxrelay_table_sampler") == 1 && m.Value("outboxrelay_events_published_total") == float64(total)
	})
	p.Stop(30 * time.Second)
	requireCleanLog(t, p.Out.String())

	// The admin commands, through PgBouncer alone.
	admin := adminEnv(bouncer)
	var status struct{ Pending, Published, Failed int }
	runJSON(t, admin, &status, "status")
	require.Equal(t, 0, status.Pending)
	code, _, stderr := runOnce(t, admin, "emit", "--count", "3", "--exchange", exchange)
	require.Equal(t, 0, code, stderr)
	testkit.Exec(t, pool, `UPDATE outbox SET status = 'failed' WHERE id = (SELECT max(id) FROM outbox)`)
	var dead []map[string]any
	runJSON(t, admin, &dead, "dead")
	require.Len(t, dead, 1)
	code, _, stderr = runOnce(t, admin, "requeue", "--all")
	require.Equal(t, 0, code, stderr)

	// Restarted, the relay delivers what came meanwhile.
	p = startRelay(t, env)
	collect(t, queue, seen, total+3, 30*time.Second)
	p.Stop(30 * time.Second)
	requireCleanLog(t, p.Out.String())
	require.Zero(t, seen.Duplicates())
}

// TestPollOnlyRelayBehindPgBouncer runs the relay with no session at all
// (--no-listen), through PgBouncer: it delivers on its poll, and is ready
// without a listener.
func TestPollOnlyRelayBehindPgBouncer(t *testing.T) {
	t.Parallel()
	direct, pool := testkit.NewOutbox(t)
	bouncer := testkit.NewPgBouncer(t, direct)
	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "#")
	p := startRelay(t, relayEnv(bouncer, exchange,
		"OUTBOX_NO_LISTEN=true",
		"OUTBOX_MIGRATE=false",
		"OUTBOX_POLL_INTERVAL=50ms",
		"OUTBOX_METRICS_SAMPLE_INTERVAL=100ms"))
	addr := testkit.HTTPAddr(t, p.Out)
	require.JSONEq(t, `{"ready":true}`, testkit.AwaitStatus(t, addr, "/readyz", 200))
	testkit.InsertEvents(t, pool, 50)
	collect(t, queue, testkit.Counter{}, 50, 30*time.Second)
	testkit.AwaitMetrics(t, addr, 30*time.Second, "the table sampled without a session", func(m testkit.Metrics) bool {
		return m.Value("outboxrelay_table_sampler") == 1 && m.Value("outboxrelay_outbox_events", "status", "pending") == 0
	})
	p.Stop(30 * time.Second)
	out := p.Out.String()
	requireCleanLog(t, out)
	require.Contains(t, out, "poll-only")
	require.NotContains(t, out, "listener connected")
}

// TestTransactionPoolRefusedWhereASessionIsNeeded: the migrations, and a
// relay given nothing but a PgBouncer URL, exit 2 with an error that says
// what to do, and leave the database as it was.
func TestTransactionPoolRefusedWhereASessionIsNeeded(t *testing.T) {
	t.Parallel()
	direct := testkit.NewDatabase(t)
	bouncer := testkit.NewPgBouncer(t, direct)
	exchange := testkit.NewExchange(t)
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want []string
	}{
		{"migrate", adminEnv(bouncer), []string{"migrate"},
			[]string{"transaction-mode pooler", "direct DATABASE_URL"}},
		{"run with the pool alone", relayEnv(bouncer, exchange), nil,
			[]string{"unsupported startup parameter", "this looks like PgBouncer", "--listener-url"}},
		{"poll-only run that migrates", relayEnv(bouncer, exchange, "OUTBOX_NO_LISTEN=true"), nil,
			[]string{"transaction-mode pooler", "session advisory lock"}},
		{"no-listen with a listener URL", relayEnv(bouncer, exchange, "OUTBOX_NO_LISTEN=true", "OUTBOX_LISTENER_URL="+direct), nil,
			[]string{"--no-listen", "--listener-url"}},
	} {
		code, _, stderr := runOnce(t, tc.env, tc.args...)
		require.Equal(t, 2, code, "%s: %s", tc.name, stderr)
		for _, w := range tc.want {
			require.Contains(t, stderr, w, tc.name)
		}
	}
	pool := testkit.NewPool(t, direct)
	require.Zero(t, testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`), "nothing migrated")
}
