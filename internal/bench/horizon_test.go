package bench

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The horizon workload runs only when named; its pinned time is rounded up
// to whole windows, so that the last pinned window is a whole one.
func TestHorizonRunsOnlyWhenNamedInWholeWindows(t *testing.T) {
	t.Parallel()
	cfg := Config{}.withDefaults()
	require.False(t, cfg.runs(WorkloadHorizon))
	require.NotContains(t, cfg.Flags(), "--only=drain,steady,idle,producer,ordered,scale,horizon")
	require.True(t, Config{Only: []string{WorkloadHorizon}}.withDefaults().runs(WorkloadHorizon))
	for _, tc := range []struct {
		pinned, window time.Duration
		windows        int
	}{
		{10 * time.Minute, 45 * time.Second, 14},
		{90 * time.Second, 45 * time.Second, 2},
		{5 * time.Second, 2 * time.Second, 3},
		{time.Second, time.Minute, 1},
	} {
		cfg := Config{HorizonPinned: tc.pinned, HorizonWindow: tc.window}.withDefaults()
		require.Equal(t, tc.windows, cfg.horizonPinnedWindows(), "%s in windows of %s", tc.pinned, tc.window)
	}
	require.Equal(t, 18*45*time.Second, Config{}.withDefaults().horizonSpan())
}

// Windows are measured by clock spans: events count where they committed
// (latency, loss) or first arrived (rate).
func TestRecordCountsWithinASpan(t *testing.T) {
	t.Parallel()
	rec := newRecord(0, 4)
	rec.commit(0, 10)
	rec.commit(1, 20)
	rec.commit(2, 30)
	rec.receive(0, 25, place{})
	rec.receive(1, 35, place{})
	rec.receive(2, 45, place{})
	s := span{20, 40}
	require.EqualValues(t, 2, rec.committedIn(s))
	require.EqualValues(t, 2, rec.receivedIn(s))
	require.EqualValues(t, 0, rec.lostIn(s))
	require.EqualValues(t, 0, rec.lostIn(span{0, 100}))
	rec.commit(3, 40)
	require.EqualValues(t, 1, rec.lostIn(span{40, 50}))
	require.Equal(t, &Latency{P50: 15e-6, P90: 15e-6, P99: 15e-6, P999: 15e-6, Max: 15e-6}, rec.latencyIn(s))
	require.Nil(t, rec.latencyIn(span{40, 50}))
}

// The p99 of the claims is the bound of the bucket that holds it, from the
// buckets' growth between two readings.
func TestClaimTimeIsTakenBetweenTwoReadings(t *testing.T) {
	t.Parallel()
	begin := counters{claims: 100, claimSeconds: 0.1, claimBuckets: []bucket{{0.001, 90}, {0.01, 100}, {0.1, 100}}}
	for _, tc := range []struct {
		name string
		end  counters
		want *ClaimTime
	}{
		{"no claim", begin, nil},
		{"all fast", counters{claims: 200, claimSeconds: 0.15, claimBuckets: []bucket{{0.001, 190}, {0.01, 200}, {0.1, 200}}},
			&ClaimTime{Mean: 0.5, P99Bound: ptr(1.0)}},
		{"two slow of a hundred", counters{claims: 200, claimSeconds: 0.3, claimBuckets: []bucket{{0.001, 188}, {0.01, 198}, {0.1, 200}}},
			&ClaimTime{Mean: 2, P99Bound: ptr(100.0)}},
		{"beyond the last bound", counters{claims: 200, claimSeconds: 10.1, claimBuckets: []bucket{{0.001, 180}, {0.01, 190}, {0.1, 190}}},
			&ClaimTime{Mean: 100, P99Bound: nil}},
	} {
		got := claimTime(begin, tc.end)
		if tc.want == nil {
			require.Nil(t, got, tc.name)
			continue
		}
		require.NotNil(t, got, tc.name)
		require.InDelta(t, tc.want.Mean, got.Mean, 1e-9, tc.name)
		require.Equal(t, tc.want.P99Bound, got.P99Bound, tc.name)
	}
}

// The last pinned window is compared with the mean of the before windows.
func TestHorizonRatioComparesTheLastPinnedWindowWithTheBaseline(t *testing.T) {
	t.Parallel()
	window := func(phase string, n int, claim, cpu, p99 float64, pending int64) Result {
		return Result{Workload: WorkloadHorizon, System: SystemRelay, Phase: phase, Window: n,
			Claim: &ClaimTime{Mean: claim}, Cost: &Cost{TotalPer1k: cpu}, Latency: &Latency{P99: p99}, Pending: ptr(pending)}
	}
	results := []Result{
		{Workload: WorkloadSteady, System: SystemRelay, Latency: &Latency{P99: 1000}},
		window(PhaseBefore, 1, 1, 300, 4, 3),
		window(PhaseBefore, 2, 2, 500, 6, 5),
		window(PhasePinned, 1, 30, 900, 50, 40),
		window(PhasePinned, 2, 3, 600, 10, 7),
		window(PhaseAfter, 1, 1, 400, 5, 2),
	}
	h := ComputeRatios(results).Horizon
	require.NotNil(t, h)
	require.Equal(t, 2, h.Before)
	require.Equal(t, 2, h.Window)
	require.Equal(t, &Comparison{Baseline: 1.5, Pinned: 3, X: ptr(2.0)}, h.ClaimMeanMS)
	require.Equal(t, &Comparison{Baseline: 400, Pinned: 600, X: ptr(1.5)}, h.CPUPer1k)
	require.Equal(t, &Comparison{Baseline: 5, Pinned: 10, X: ptr(2.0)}, h.LagP99MS)
	require.Equal(t, ptr(int64(5)), h.PendingBefore)
	require.Equal(t, ptr(int64(7)), h.PendingPinned)

	results[4].Claim = nil // the relay's metrics turned off
	require.Nil(t, ComputeRatios(results).Horizon.ClaimMeanMS)
	require.Nil(t, ComputeRatios(results[:3]).Horizon, "no pinned window")
}
