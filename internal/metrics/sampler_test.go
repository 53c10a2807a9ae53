package metrics_test

import (
	"context"
	"net"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/metrics"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
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

// startSamplerWith is startSampler whose configuration configure changes,
// if not nil, before the sampler is made.
func startSamplerWith(t *testing.T, dbURL string, interval time.Duration, session bool, configure func(*metrics.SamplerConfig)) *sampler {
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
	}
	if configure != nil {
		configure(&cfg)
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

// holderAge is one holder's vacuum horizon gauges, as gathered at once.
type holderAge struct {
	transactions, seconds float64
	exported              bool
}

// horizon gathers the vacuum horizon gauges of holder.
func (s *sampler) horizon(t *testing.T, holder string) holderAge {
	t.Helper()
	families, err := s.reg.Gather()
	require.NoError(t, err)
	var (
		a     holderAge
		found int
	)
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != 1 || m.GetLabel()[0].GetName() != "holder" || m.GetLabel()[0].GetValue() != holder {
				continue
			}
			switch f.GetName() {
			case "outboxrelay_vacuum_horizon_age_transactions":
				a.transactions = m.GetGauge().GetValue()
				found++
			case "outboxrelay_vacuum_horizon_age_seconds":
				a.seconds = m.GetGauge().GetValue()
				found++
			}
		}
	}
	a.exported = found == 2
	return a
}

// holdHorizon opens a REPEATABLE READ transaction on dbURL that reads the
// outbox, so its snapshot holds back vacuum's horizon until end is called,
// and then has three more transaction IDs consumed, so that age() of its
// snapshot's xmin is at least 3. It returns the time just after the
// transaction began, which its xact_start precedes, and the time just
// before, which it follows.
func holdHorizon(t *testing.T, dbURL string, pool *pgxpool.Pool) (before, after time.Time, end func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	before = time.Now()
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	after = time.Now()
	var n int
	require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n))
	for range 3 {
		testkit.QueryInt(t, pool, `SELECT txid_current()`)
	}
	return before, after, func() { require.NoError(t, tx.Commit(ctx)) }
}

// leastPrivilegeURL creates a role with sql/outboxrelay_role.sql, the
// relay's least-privilege role, and returns dbURL as that role (trust
// authentication on 127.0.0.1). The role is dropped when the test ends.
func leastPrivilegeURL(t *testing.T, dbURL string, pool *pgxpool.Pool) string {
	t.Helper()
	role := testkit.UniqueName("sampler_role")
	t.Cleanup(func() {
		testkit.Exec(t, pool, `DROP OWNED BY `+pgx.Identifier{role}.Sanitize())
		testkit.Exec(t, pool, `DROP ROLE `+pgx.Identifier{role}.Sanitize())
	})
	out, err := exec.Command("psql", dbURL, "-X", "-q", "-v", "role="+role, "-f", "../../sql/outboxrelay_role.sql").CombinedOutput()
	require.NoError(t, err, string(out))
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = url.User(role)
	return u.String()
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
	require.Zero(t, testutil.CollectAndCount(second.reg, "outboxrelay_vacuum_horizon_age_seconds"), "nor the vacuum horizon's")
	require.Equal(t, 5, testutil.CollectAndCount(first.reg, "outboxrelay_vacuum_horizon_age_seconds"), "the first exports them, one per holder")
	v, _ := second.gauge(t, "outboxrelay_table_sampler")
	require.Zero(t, v)

	first.stop()
	testkit.WaitFor(t, 10*time.Second, "the second sampler to take over", func() bool {
		return testutil.CollectAndCount(second.reg, "outboxrelay_outbox_events") == 3
	})
	v, _ = first.gauge(t, "outboxrelay_table_sampler")
	require.Zero(t, v, "a stopped sampler says it samples no more")
	require.Zero(t, testutil.CollectAndCount(first.reg, "outboxrelay_outbox_events"))
	require.Zero(t, testutil.CollectAndCount(first.reg, "outboxrelay_vacuum_horizon_age_transactions"))
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
	s := startSamplerWith(t, dbURL, interval, true, func(cfg *metrics.SamplerConfig) { cfg.Session.DialFunc = slow })
	testkit.WaitFor(t, 10*time.Second, "the sampler to sample", func() bool {
		v, _ := s.gauge(t, "outboxrelay_table_sampler")
		return v == 1
	})
}

// TestVacuumHorizonGaugesFollowALongTransaction holds a REPEATABLE READ
// transaction open on the sampled database, as a pg_dump or a report does,
// while other transactions go on: the sampler reports a backend holding
// the horizon, aged in transactions and in seconds since the transaction
// began, and 0 again once it ends.
func TestVacuumHorizonGaugesFollowALongTransaction(t *testing.T) {
	t.Parallel()
	dbURL, pool := testkit.NewOutbox(t)
	const interval = 100 * time.Millisecond
	s := startSampler(t, dbURL, interval, true)
	testkit.WaitFor(t, 10*time.Second, "the sampler to find no backend holding the horizon", func() bool {
		a := s.horizon(t, "backend")
		return a.exported && a.transactions == 0 && a.seconds == 0
	})
	for _, holder := range []string{"prepared_transaction", "standby_feedback", "replication_slot", "replication_slot_catalog"} {
		require.True(t, s.horizon(t, holder).exported, holder)
	}

	before, after, end := holdHorizon(t, dbURL, pool)
	held := s.horizon(t, "backend")
	testkit.WaitFor(t, 30*time.Second, "the transaction held for 2 s", func() bool {
		held = s.horizon(t, "backend")
		return held.transactions >= 3 && held.seconds >= 2
	})
	// The gauge is the last sample's: at most an interval old, plus the
	// time a sample takes on a loaded machine.
	const tolerance = interval + time.Second
	require.GreaterOrEqual(t, held.seconds, (time.Since(after) - tolerance).Seconds(), "aged since the transaction began")
	require.LessOrEqual(t, held.seconds, time.Since(before).Seconds(), "not older than the transaction")

	end()
	testkit.WaitFor(t, 10*time.Second, "the gauges back to 0", func() bool {
		a := s.horizon(t, "backend")
		return a.exported && a.transactions == 0 && a.seconds == 0
	})
}

// TestVacuumHorizonAsTheLeastPrivilegeRole samples as the relay's
// least-privilege role, which sees another role's snapshot but not when its
// transaction began: the sampler finds the superuser's transaction, ages it
// by its own clock from the first sample that saw it, and reports 0 once it
// ends.
func TestVacuumHorizonAsTheLeastPrivilegeRole(t *testing.T) {
	t.Parallel()
	dbURL, pool := testkit.NewOutbox(t)
	clock := testkit.NewClock()
	s := startSamplerWith(t, leastPrivilegeURL(t, dbURL, pool), 20*time.Millisecond, true,
		func(cfg *metrics.SamplerConfig) { cfg.Now = clock.Now })
	testkit.WaitFor(t, 10*time.Second, "the sampler to sample", func() bool {
		v, _ := s.gauge(t, "outboxrelay_table_sampler")
		return v == 1 && s.horizon(t, "backend").exported
	})

	_, _, end := holdHorizon(t, dbURL, pool)
	testkit.WaitFor(t, 30*time.Second, "the superuser's transaction seen", func() bool {
		return s.horizon(t, "backend").transactions >= 3
	})
	require.Zero(t, s.horizon(t, "backend").seconds, "aged from the first sample that saw it, by the sampler's clock")
	clock.Advance(10 * time.Minute)
	testkit.WaitFor(t, 10*time.Second, "the holder aged by the clock", func() bool {
		a := s.horizon(t, "backend")
		return a.transactions >= 3 && a.seconds == 600
	})

	end()
	testkit.WaitFor(t, 10*time.Second, "the gauges back to 0", func() bool {
		a := s.horizon(t, "backend")
		return a.exported && a.transactions == 0 && a.seconds == 0
	})
}
