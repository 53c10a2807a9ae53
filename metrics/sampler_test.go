package metrics_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/metrics"
	"github.com/outboxrelay/outboxrelay/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testkit.LeakOptions()...) }

// sampler is one relay's metrics and sampler, running until stop.
type sampler struct {
	reg  *prometheus.Registry
	stop func()
}

// startSampler starts a sampler with a session on dbURL, or none if
// session is false.
func startSampler(t *testing.T, dbURL string, interval time.Duration, session bool) *sampler {
	t.Helper()
	return startSamplerWith(t, dbURL, interval, session, nil)
}

// startSamplerWith is startSampler whose session, if any, dials with dial.
func startSamplerWith(t *testing.T, dbURL string, interval time.Duration, session bool, dial pgconn.DialFunc) *sampler {
	t.Helper()
	pool := testkit.NewPool(t, dbURL)
	store, err := claim.New(pool, claim.Config{})
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, metrics.Options{Version: "test"})
	require.NoError(t, err)
	cfg := metrics.SamplerConfig{Pool: pool, Store: store, Interval: interval}
	if session {
		cfg.Session, err = pgx.ParseConfig(dbURL)
		require.NoError(t, err)
		if dial != nil {
			cfg.Session.DialFunc = dial
		}
	}
	s, err := m.Sampler(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	var stopped bool
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			require.NoError(t, <-done)
		}
	}
	t.Cleanup(stop)
	return &sampler{reg: reg, stop: stop}
}

func (s *sampler) gauge(t *testing.T, name string) (float64, bool) {
	t.Helper()
	families, err := s.reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) > 0 {
			return f.GetMetric()[0].GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// TestOneRelayAtATimeSamplesTheTable runs two samplers on one table: one
// holds the sampling lock and exports the table gauges, the other exports
// none; when the first stops, the second takes over.
func TestOneRelayAtATimeSamplesTheTable(t *testing.T) {
	t.Parallel()
	dbURL, pool := testkit.NewOutbox(t)
	testkit.InsertEvents(t, pool, 7)
	testkit.Exec(t, pool, `UPDATE outbox SET status = 'failed' WHERE id <= 2`)

	first := startSampler(t, dbURL, 20*time.Millisecond, true)
	testkit.WaitFor(t, 10*time.Second, "the first sampler to sample", func() bool {
		v, _ := first.gauge(t, "outboxrelay_table_sampler")
		return v == 1
	})
	second := startSampler(t, dbURL, 20*time.Millisecond, true)
	// The second has tried for the lock once it reports its queue usage.
	testkit.WaitFor(t, 10*time.Second, "the second sampler to run", func() bool {
		_, ok := second.gauge(t, "outboxrelay_notification_queue_usage_ratio")
		return ok && testutil.CollectAndCount(second.reg, "outboxrelay_table_sampler") == 1
	})

	require.NoError(t, testutil.GatherAndCompare(first.reg, strings.NewReader(`
# HELP outboxrelay_outbox_events Rows of the outbox table by status: pending and failed counted, published estimated from the planner's row count. Exported by the sampling relay only.
# TYPE outboxrelay_outbox_events gauge
outboxrelay_outbox_events{status="failed"} 2
outboxrelay_outbox_events{status="pending"} 5
outboxrelay_outbox_events{status="published"} 0
`), "outboxrelay_outbox_events"))
	age, ok := first.gauge(t, "outboxrelay_oldest_pending_age_seconds")
	require.True(t, ok)
	require.Positive(t, age)
	require.Less(t, age, 60.0)

	require.Zero(t, testutil.CollectAndCount(second.reg, "outboxrelay_outbox_events"), "the second relay exports no table gauges")
	v, _ := second.gauge(t, "outboxrelay_table_sampler")
	require.Zero(t, v)

	first.stop()
	testkit.WaitFor(t, 10*time.Second, "the second sampler to take over", func() bool {
		return testutil.CollectAndCount(second.reg, "outboxrelay_outbox_events") == 3
	})
	v, _ = first.gauge(t, "outboxrelay_table_sampler")
	require.Zero(t, v, "a stopped sampler says it samples no more")
	require.Zero(t, testutil.CollectAndCount(first.reg, "outboxrelay_outbox_events"))
}

// TestWithoutASessionEveryRelaySamples runs two samplers with no session
// to hold a lock on (a relay with --no-listen): both sample and export the
// table gauges, through their stores.
func TestWithoutASessionEveryRelaySamples(t *testing.T) {
	t.Parallel()
	dbURL, pool := testkit.NewOutbox(t)
	testkit.InsertEvents(t, pool, 3)
	a := startSampler(t, dbURL, 20*time.Millisecond, false)
	b := startSampler(t, dbURL, 20*time.Millisecond, false)
	for _, s := range []*sampler{a, b} {
		testkit.WaitFor(t, 10*time.Second, "the sampler to sample", func() bool {
			v, _ := s.gauge(t, "outboxrelay_table_sampler")
			return v == 1
		})
		require.NoError(t, testutil.GatherAndCompare(s.reg, strings.NewReader(`
# HELP outboxrelay_outbox_events Rows of the outbox table by status: pending and failed counted, published estimated from the planner's row count. Exported by the sampling relay only.
# TYPE outboxrelay_outbox_events gauge
outboxrelay_outbox_events{status="failed"} 0
outboxrelay_outbox_events{status="pending"} 3
outboxrelay_outbox_events{status="published"} 0
`), "outboxrelay_outbox_events"))
	}
}

// TestASessionSlowerToOpenThanTheIntervalStillSamples opens the sampler's
// session through a dialer that takes five intervals to connect, as a
// loaded server may take to start a session: the sampler waits for it and
// samples, where bounding the opening by the interval would give up on
// every try and never sample.
func TestASessionSlowerToOpenThanTheIntervalStillSamples(t *testing.T) {
	t.Parallel()
	dbURL, pool := testkit.NewOutbox(t)
	testkit.InsertEvents(t, pool, 3)
	const interval = 20 * time.Millisecond
	var d net.Dialer
	slow := func(ctx context.Context, network, addr string) (net.Conn, error) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * interval):
		}
		return d.DialContext(ctx, network, addr)
	}
	s := startSamplerWith(t, dbURL, interval, true, slow)
	testkit.WaitFor(t, 10*time.Second, "the sampler to sample", func() bool {
		v, _ := s.gauge(t, "outboxrelay_table_sampler")
		return v == 1
	})
}
