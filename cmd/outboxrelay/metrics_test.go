package main_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/redact"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// TestEveryMetricMovesWithRealDeliveries runs a relay against the real
// services and watches its /metrics: good events arrive, an unroutable one
// is retried, one whose exchange is missing and one with malformed headers
// are dead-lettered, a burst closes the notification gate, a stalled
// listener fills the notification queue, a long transaction holds back
// vacuum's horizon. Each metric the issues name must move.
func TestEveryMetricMovesWithRealDeliveries(t *testing.T) {
	t.Parallel()
	dbURL, pool := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "order.#")
	p := startRelay(t, relayEnv(dbURL, exchange,
		"OUTBOX_MAX_ATTEMPTS=3", "OUTBOX_RETRY_MIN=1h", "OUTBOX_RETRY_MAX=1h",
		"OUTBOX_METRICS_SAMPLE_INTERVAL=100ms", "OUTBOX_BUSY_RATE=50", "OUTBOX_CLEANUP_INTERVAL=0"))
	addr := testkit.HTTPAddr(t, p.Out)

	ready := testkit.AwaitMetrics(t, addr, 30*time.Second, "a ready relay", func(m testkit.Metrics) bool {
		return m.Value("outboxrelay_ready") == 1
	})
	for _, service := range []string{"postgres", "listener", "rabbitmq"} {
		require.Equal(t, 1.0, ready.Value("outboxrelay_connection_up", "service", service), service)
	}
	require.Zero(t, ready.Value("outboxrelay_broker_blocked"))
	require.Equal(t, 1.0, ready.Value("outboxrelay_broker_connected", "url", redact.URL(testkit.AMQPURL())), "the broker connected to")
	// The sampler takes its lock on a session of its own, which may come
	// after readiness.
	testkit.AwaitMetrics(t, addr, 30*time.Second, "the only relay to sample the table", func(m testkit.Metrics) bool {
		return m.Value("outboxrelay_table_sampler") == 1
	})
	for _, name := range []string{"outboxrelay_build_info", "go_goroutines", "process_cpu_seconds_total"} {
		require.Contains(t, ready.Names(), name)
	}

	// The gate closes under a steady stream above --busy-rate.
	stop := make(chan struct{})
	var producing sync.WaitGroup
	producing.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			_, _ = pool.Exec(context.Background(), `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
				SELECT 'order', 'burst', 'created', '{}' FROM generate_series(1, 10)`)
		}
	})
	testkit.AwaitMetrics(t, addr, 30*time.Second, "the gate closed", func(m testkit.Metrics) bool {
		return m.Value("outboxrelay_gate_closed") == 1
	})
	close(stop)
	producing.Wait()
	testkit.AwaitMetrics(t, addr, 30*time.Second, "the gate open again, its close counted", func(m testkit.Metrics) bool {
		return m.Value("outboxrelay_gate_closed") == 0 && m.Value("outboxrelay_gate_closes_total") >= 1
	})

	// Good events, an unroutable one (retried in an hour), one to a missing
	// exchange on its last attempt and one with malformed headers (both
	// dead-lettered).
	testkit.InsertEvents(t, pool, 20)
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, exchange, headers, attempts) VALUES
		('nowhere', '1', 'created', '{}', NULL, NULL, 0),
		('order', '2', 'created', '{}', $1, NULL, 2),
		('order', '3', 'created', '{}', NULL, '[1]', 0)`, testkit.UniqueName("missing"))
	collect(t, queue, testkit.Counter{}, 20, 30*time.Second)

	m := testkit.AwaitMetrics(t, addr, 30*time.Second, "the deliveries and failures counted", func(m testkit.Metrics) bool {
		return m.Value("outboxrelay_events_published_total") >= 20 &&
			m.Value("outboxrelay_events_retried_total", "reason", "returned") == 1 &&
			m.Value("outboxrelay_events_dead_lettered_total", "reason", "missing_exchange") == 1 &&
			m.Value("outboxrelay_events_dead_lettered_total", "reason", "invalid") == 1 &&
			m.Value("outboxrelay_outbox_events", "status", "pending") == 1 &&
			m.Value("outboxrelay_outbox_events", "status", "failed") == 2
	})
	published := m.Value("outboxrelay_events_published_total")
	require.Equal(t, published, m.Value("outboxrelay_event_lag_seconds_count"), "a lag per published event")
	require.Positive(t, m.Value("outboxrelay_event_lag_seconds_sum"))
	require.Positive(t, m.Value("outboxrelay_claim_duration_seconds_count"))
	require.Positive(t, m.Value("outboxrelay_publish_duration_seconds_count"))
	require.GreaterOrEqual(t, m.Value("outboxrelay_batch_events_sum"), published+3, "every claimed event counted in a batch")
	require.Positive(t, m.Value("outboxrelay_oldest_pending_age_seconds"), "the unroutable event waits for its retry")
	require.Zero(t, m.Value("outboxrelay_events_retried_total", "reason", "missing_exchange"))

	// Published rows are estimated from the planner's row count.
	testkit.Exec(t, pool, `ANALYZE outbox`)
	testkit.AwaitMetrics(t, addr, 30*time.Second, "the published rows estimated", func(m testkit.Metrics) bool {
		return m.Value("outboxrelay_outbox_events", "status", "published") >= 20
	})

	// A listener that never reads holds notifications in the queue.
	fillNotificationQueue(t, dbURL)
	testkit.AwaitMetrics(t, addr, 30*time.Second, "the notification queue in use", func(m testkit.Metrics) bool {
		return m.Value("outboxrelay_notification_queue_usage_ratio") > 0
	})

	// A REPEATABLE READ transaction that has read holds back vacuum's
	// horizon until it ends, while other transactions go on: the sampling
	// relay reports a backend holding it, longer than any of its own
	// claims would.
	ctx := context.Background()
	holder, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { holder.Close(context.Background()) })
	tx, err := holder.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT count(*) FROM outbox`)
	require.NoError(t, err)
	testkit.QueryInt(t, pool, `SELECT txid_current()`)
	testkit.AwaitMetrics(t, addr, 30*time.Second, "a backend holding vacuum's horizon", func(m testkit.Metrics) bool {
		return m.Value("outboxrelay_vacuum_horizon_age_transactions", "holder", "backend") >= 1 &&
			m.Value("outboxrelay_vacuum_horizon_age_seconds", "holder", "backend") >= 1
	})
	require.NoError(t, tx.Rollback(ctx))
}

// fillNotificationQueue LISTENs on a connection that then stays in an open
// transaction, so it reads nothing, and sends it a few megabytes of
// notifications, which stay queued until the test ends.
func fillNotificationQueue(t *testing.T, dbURL string) {
	t.Helper()
	ctx := context.Background()
	stalled, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { stalled.Close(context.Background()) })
	channel := testkit.UniqueName("stalled")
	_, err = stalled.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize())
	require.NoError(t, err)
	_, err = stalled.Exec(ctx, "BEGIN")
	require.NoError(t, err)
	sender, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer sender.Close(ctx)
	_, err = sender.Exec(ctx, `SELECT pg_notify($1, i::text || $2) FROM generate_series(1, 4000) AS i`,
		channel, strings.Repeat("x", 1000))
	require.NoError(t, err)
}

// TestOrderedMetricsCountReleasesAndBlockedAggregates runs an ordered relay
// with batches of four: the second claim of one aggregate takes a run of
// events, the second of which is unroutable and dead-lettered; the rest of
// the run is released, and the aggregate is blocked behind it.
func TestOrderedMetricsCountReleasesAndBlockedAggregates(t *testing.T) {
	t.Parallel()
	dbURL, pool := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "order.#")
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, routing_key)
		SELECT 'order', 'a', 'created', jsonb_build_object('n', i), CASE WHEN i = 3 THEN 'nowhere' END
		FROM generate_series(1, 8) AS i`)
	p := startRelay(t, relayEnv(dbURL, exchange, "OUTBOX_ORDERING=aggregate", "OUTBOX_BATCH_SIZE=4",
		"OUTBOX_WORKERS=1", "OUTBOX_MAX_ATTEMPTS=1", "OUTBOX_METRICS_SAMPLE_INTERVAL=100ms"))
	addr := testkit.HTTPAddr(t, p.Out)

	collect(t, queue, testkit.Counter{}, 2, 30*time.Second)
	// Events 1 and 2 count once their mark went through, which may ride
	// on the claim after the release (--mark-delay), and the table's
	// gauges show it at the sample after that.
	m := testkit.AwaitMetrics(t, addr, 30*time.Second, "the marks, the release and the blocked aggregate", func(m testkit.Metrics) bool {
		return m.Value("outboxrelay_events_released_total") >= 1 &&
			m.Value("outboxrelay_blocked_aggregates") == 1 &&
			m.Value("outboxrelay_events_published_total") >= 2 &&
			m.Value("outboxrelay_outbox_events", "status", "pending") <= 5
	})
	require.Equal(t, 1.0, m.Value("outboxrelay_events_dead_lettered_total", "reason", "returned"))
	require.Equal(t, 2.0, m.Value("outboxrelay_events_published_total"), "events 1 and 2 only")
	require.Equal(t, 5.0, m.Value("outboxrelay_outbox_events", "status", "pending"), "events 4 to 8 wait")
}

// TestReadyzFollowsRabbitMQThroughTheProxy cuts the relay's connection to
// RabbitMQ: /readyz turns 503 naming RabbitMQ, and 200 again once the
// connection is back, while /livez stays 200 throughout.
func TestReadyzFollowsRabbitMQThroughTheProxy(t *testing.T) {
	t.Parallel()
	dbURL, _ := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	proxy, amqpURL := testkit.NewAMQPProxy(t)
	p := startRelay(t, append(relayEnv(dbURL, exchange), "AMQP_URL="+amqpURL))
	addr := testkit.HTTPAddr(t, p.Out)

	require.JSONEq(t, `{"ready":true}`, testkit.AwaitStatus(t, addr, "/readyz", 200))

	proxy.Cut()
	body := testkit.AwaitStatus(t, addr, "/readyz", 503)
	require.Contains(t, body, `"rabbitmq":"not connected"`)
	code, live := testkit.HTTPStatus(t, addr, "/livez")
	require.Equal(t, 200, code, "liveness checks no outside service: %s", live)
	m := testkit.Scrape(t, addr)
	require.Zero(t, m.Value("outboxrelay_ready"))
	require.Zero(t, m.Value("outboxrelay_connection_up", "service", "rabbitmq"))
	require.Equal(t, 1.0, m.Value("outboxrelay_connection_up", "service", "postgres"))

	proxy.Restore()
	require.JSONEq(t, `{"ready":true}`, testkit.AwaitStatus(t, addr, "/readyz", 200))
	code, _ = testkit.HTTPStatus(t, addr, "/livez")
	require.Equal(t, 200, code)
}

// TestReadyzNeedsTheOutboxTrigger disables the outbox trigger under a
// running relay: its events would wait for the fallback poll, so /readyz
// turns 503 and names it, and 200 again once the trigger is back.
func TestReadyzNeedsTheOutboxTrigger(t *testing.T) {
	t.Parallel()
	dbURL, pool := testkit.NewOutbox(t)
	p := startRelay(t, relayEnv(dbURL, testkit.NewExchange(t)))
	addr := testkit.HTTPAddr(t, p.Out)
	testkit.AwaitStatus(t, addr, "/readyz", 200)
	testkit.Exec(t, pool, `ALTER TABLE outbox DISABLE TRIGGER outbox_notify`)
	require.Contains(t, testkit.AwaitStatus(t, addr, "/readyz", 503), "no outbox trigger on outbox")
	testkit.Exec(t, pool, `ALTER TABLE outbox ENABLE TRIGGER outbox_notify`)
	testkit.AwaitStatus(t, addr, "/readyz", 200)
}

// --pprof serves Go's profiles beside the metrics: the running relay's
// goroutines by function and a CPU profile as `go tool pprof` reads it
// (gzipped protobuf). Without it the paths are not served.
func TestPprofServesTheRelaysProfilesOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	dbURL, _ := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)

	off := testkit.HTTPAddr(t, startRelay(t, relayEnv(dbURL, exchange)).Out)
	testkit.AwaitStatus(t, off, "/readyz", 200)
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/goroutine?debug=1", "/debug/pprof/profile?seconds=1"} {
		code, _ := testkit.HTTPStatus(t, off, path)
		require.Equal(t, 404, code, path)
	}

	on := testkit.HTTPAddr(t, startRelay(t, relayEnv(dbURL, exchange, "OUTBOX_PPROF=true")).Out)
	testkit.AwaitStatus(t, on, "/readyz", 200)
	code, goroutines := testkit.HTTPStatus(t, on, "/debug/pprof/goroutine?debug=1")
	require.Equal(t, 200, code)
	require.Contains(t, goroutines, "outboxrelay/internal/relay.(*Relay).Run", "the relay's own goroutines")
	code, profile := testkit.HTTPStatus(t, on, "/debug/pprof/profile?seconds=1")
	require.Equal(t, 200, code, profile)
	require.True(t, strings.HasPrefix(profile, "\x1f\x8b"), "a gzipped CPU profile")
}

// The relay runs in the process it was started as, with the environment
// it was given: it never re-executes itself (to change GODEBUG or anything
// else), which would surprise debuggers, supervisors and upgrades that
// replace the binary.
func TestRelayRunsWithTheEnvironmentItWasGiven(t *testing.T) {
	t.Parallel()
	dbURL, _ := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	p := startedRelay(t, relayEnv(dbURL, exchange, "GODEBUG=madvdontneed=1"))
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p.Pid()))
	require.NoError(t, err)
	var godebug []string
	for _, kv := range strings.Split(string(environ), "\x00") {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			godebug = append(godebug, v)
		}
	}
	require.Equal(t, []string{"madvdontneed=1"}, godebug, "GODEBUG as given")
	require.Equal(t, 1, strings.Count(p.Out.String(), `"outboxrelay starting"`), "started once")
}

// --procs sets GOMAXPROCS, one by default; the Go runtime's own gauge
// shows it.
func TestProcsSetsGOMAXPROCS(t *testing.T) {
	t.Parallel()
	dbURL, _ := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	for _, tc := range []struct {
		name string
		args []string
		want float64
	}{
		{"default", nil, 1},
		{"three", []string{"--procs=3"}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startRelay(t, relayEnv(dbURL, exchange), tc.args...)
			m := testkit.AwaitMetrics(t, testkit.HTTPAddr(t, p.Out), 30*time.Second, "the runtime's gauges", func(m testkit.Metrics) bool {
				return m.Value("go_sched_gomaxprocs_threads") > 0
			})
			require.Equal(t, tc.want, m.Value("go_sched_gomaxprocs_threads"))
		})
	}
}
