package metrics_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/metrics"
	"github.com/outboxrelay/outboxrelay/internal/relay"
	"github.com/outboxrelay/outboxrelay/publish"
)

var _ relay.Observer = (*metrics.Metrics)(nil)

// family gathers reg and returns the named family's metrics.
func family(t testing.TB, reg *prometheus.Registry, name string) []*dto.Metric {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == name {
			return f.GetMetric()
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

func TestObserverCountsWhatTheRelayReports(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, metrics.Options{Version: "v1.2.3"})
	require.NoError(t, err)

	m.Claimed(3, 2*time.Millisecond)
	m.Claimed(0, time.Millisecond) // an empty claim: timed, no batch
	m.Published([]time.Duration{time.Millisecond, 3 * time.Millisecond}, 5*time.Millisecond)
	m.Retried(publish.ReasonReturned, 2)
	m.DeadLettered(publish.ReasonInvalid, 1)
	m.Released(4)
	m.GateClosed(true)

	require.Equal(t, 2.0, family(t, reg, "outboxrelay_events_published_total")[0].GetCounter().GetValue())
	lag := family(t, reg, "outboxrelay_event_lag_seconds")[0].GetHistogram()
	require.Equal(t, uint64(2), lag.GetSampleCount())
	require.InDelta(t, 0.004, lag.GetSampleSum(), 1e-9)
	require.Equal(t, uint64(2), family(t, reg, "outboxrelay_claim_duration_seconds")[0].GetHistogram().GetSampleCount())
	require.Equal(t, uint64(1), family(t, reg, "outboxrelay_batch_events")[0].GetHistogram().GetSampleCount())
	require.Equal(t, uint64(1), family(t, reg, "outboxrelay_publish_duration_seconds")[0].GetHistogram().GetSampleCount())
	require.Equal(t, 4.0, family(t, reg, "outboxrelay_events_released_total")[0].GetCounter().GetValue())
	require.Equal(t, 1.0, family(t, reg, "outboxrelay_gate_closed")[0].GetGauge().GetValue())
	require.Equal(t, 1.0, family(t, reg, "outboxrelay_gate_closes_total")[0].GetCounter().GetValue())
	byReason := func(name string) map[string]float64 {
		out := map[string]float64{}
		for _, s := range family(t, reg, name) {
			out[s.GetLabel()[0].GetValue()] = s.GetCounter().GetValue()
		}
		return out
	}
	require.Equal(t, map[string]float64{"returned": 2, "nacked": 0, "timeout": 0, "missing_exchange": 0,
		"connection": 0, "invalid": 0, "other": 0}, byReason("outboxrelay_events_retried_total"))
	require.Equal(t, 1.0, byReason("outboxrelay_events_dead_lettered_total")["invalid"])
	build := family(t, reg, "outboxrelay_build_info")[0]
	require.Equal(t, "v1.2.3", build.GetLabel()[1].GetValue())
}

// TestGateClosesCountOpenToClosed reports the gate as a relay does: closed,
// refreshed closed, opened, closed again. Two closes, the refresh not one.
func TestGateClosesCountOpenToClosed(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, metrics.Options{})
	require.NoError(t, err)
	closes := func() float64 { return family(t, reg, "outboxrelay_gate_closes_total")[0].GetCounter().GetValue() }

	m.GateClosed(false) // the relay opens its gate at start
	require.Zero(t, closes())
	m.GateClosed(true)
	m.GateClosed(true) // a refresh
	require.Equal(t, 1.0, closes())
	m.GateClosed(false)
	require.Equal(t, 1.0, closes())
	m.GateClosed(true)
	require.Equal(t, 2.0, closes())
}

// BenchmarkPublishedBatch is the observer's cost on the hot path: one
// claim and one published batch of 500 events, as a busy relay reports
// them. Divide by 500 for the cost per event.
func BenchmarkPublishedBatch(b *testing.B) {
	m, err := metrics.New(prometheus.NewRegistry(), metrics.Options{})
	require.NoError(b, err)
	lags := make([]time.Duration, 500)
	for i := range lags {
		lags[i] = time.Duration(i) * 37 * time.Microsecond
	}
	b.ReportAllocs()
	for b.Loop() {
		m.Claimed(len(lags), 2*time.Millisecond)
		m.Published(lags, 10*time.Millisecond)
	}
}
