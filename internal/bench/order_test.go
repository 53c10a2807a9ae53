package bench

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestShapeParsesAndPrints(t *testing.T) {
	t.Parallel()
	var s Shape
	require.NoError(t, s.UnmarshalText([]byte("1000x50")))
	require.Equal(t, Shape{Aggregates: 1000, Events: 50}, s)
	require.Equal(t, "1000x50", s.String())
	require.Equal(t, 50000, s.total())
	for _, bad := range []string{"", "1000", "x50", "1000x", "ax5", "1000×50"} {
		require.Error(t, new(Shape).UnmarshalText([]byte(bad)), bad)
	}
	require.ErrorContains(t, Config{OrderedShapes: []Shape{{0, 5}}, RelayBinary: "/bin/true"}.Validate(), "OrderedShapes 0x5")
	require.ErrorContains(t, Config{Producers: 3, Only: []string{WorkloadOrdered}, RelayBinary: "/bin/true"}.Validate(), "OrderedSteadyAggregates 1000")
	require.NoError(t, Config{Producers: 3, Only: []string{WorkloadDrain}, RelayBinary: "/bin/true"}.Validate())
}

func TestPlaceIsReadFromTheMessage(t *testing.T) {
	t.Parallel()
	p := newPayloads(64)
	require.Equal(t, place{aggregate: 17, seq: 12}, placeOf("17", []byte(p.withSeq(5, 12))))
	// As PostgreSQL prints the jsonb the backlog builds.
	require.Equal(t, place{aggregate: 0, seq: 3}, placeOf("0", []byte(`{"n": 9, "pad": "xx", "seq": 3}`)))
	require.Equal(t, place{aggregate: -1, seq: -1}, placeOf(nil, []byte(p.of(5))))
	require.Equal(t, place{aggregate: -1, seq: 4}, placeOf("agg-1", []byte(`{"seq": 4}`)))
}

// Two aggregates of three events: slots 0 … 5 are (aggregate, seq) (0,1),
// (1,1), (0,2), (1,2), (0,3), (1,3).
func TestRecordCountsFirstArrivalsOutOfOrder(t *testing.T) {
	t.Parallel()
	rec := newShapedRecord(100, 6, 2)
	require.Equal(t, 2, rec.aggregates())
	require.Equal(t, place{aggregate: 1, seq: 2}, rec.placeAt(3))
	arrive := func(slot int, p place) { rec.receive(rec.number(slot), 1, p) }
	arrive(0, place{0, 1})
	arrive(4, place{0, 3}) // before (0,2): out of order
	arrive(2, place{0, 2})
	arrive(0, place{0, 1}) // a duplicate: not a first arrival
	arrive(1, place{1, 1})
	arrive(3, place{0, 2}) // says another aggregate than written
	arrive(5, place{1, 3}) // its predecessors have all arrived
	require.EqualValues(t, 6, rec.count())
	require.EqualValues(t, 1, rec.duplicates())
	require.Equal(t, ptr(int64(2)), rec.outOfOrder())
	require.Nil(t, newRecord(0, 3).outOfOrder())

	// Aggregate 0's events 2 and 3 arrive before its event 1: both late,
	// and not only the one right after the gap.
	rec = newShapedRecord(0, 6, 2)
	for _, slot := range []int{2, 4, 0} {
		rec.receive(int64(slot), 1, rec.placeAt(slot))
	}
	require.Equal(t, ptr(int64(2)), rec.outOfOrder())
}

func TestOrderedRatiosCompareTheOrderedRelayWithTheRelay(t *testing.T) {
	t.Parallel()
	yes, no := true, false
	results := []Result{
		{Workload: WorkloadProducer, System: SystemRelay, Concurrency: 8, Trigger: &yes, OrderingIndex: &no, Rate: 1000},
		{Workload: WorkloadProducer, System: SystemRelay, Concurrency: 8, Trigger: &no, OrderingIndex: &no, Rate: 1250},
		{Workload: WorkloadProducer, System: SystemKeyscan, Concurrency: 8, Trigger: &yes, OrderingIndex: &yes, Rate: 900},
		{Workload: WorkloadOrdered, System: SystemRelay, Aggregates: 10, PerAggregate: 5, Rate: 200},
		{Workload: WorkloadOrdered, System: SystemKeyscan, Aggregates: 10, PerAggregate: 5, Rate: 180},
		{Workload: WorkloadOrdered, System: SystemRelay, TargetRate: 1000, Aggregates: 10, Rate: 1000},
	}
	r := ComputeRatios(results)
	require.Equal(t, []ProducerRatio{{Concurrency: 8, WithTrigger: 1000, WithoutTrigger: 1250, Pct: 80, PairPct: []float64{80},
		WithIndex: ptr(900.0), IndexPct: ptr(90.0)}}, r.Producer)
	require.Equal(t, []OrderedRatio{{Shape: "10x5", Unordered: 200, Keyscan: 180, KeyscanPct: ptr(90.0)}}, r.Ordered)
	require.Equal(t, "ordered 10x5", label(results[3]))
	require.Equal(t, "ordered 1000/s over 10", label(results[5]))
	require.Equal(t, "producer c=8 +trigger +index", label(results[2]))
	require.Equal(t, "producer c=8 +trigger", label(results[0]))
}

// Pairs of producer runs, on then off, interleaved: the ratio is that of
// the means, and each pair keeps its own.
func TestProducerRatioAveragesItsPairs(t *testing.T) {
	t.Parallel()
	yes, no := true, false
	run := func(c int, sys string, trigger, index *bool, rate float64) Result {
		return Result{Workload: WorkloadProducer, System: sys, Concurrency: c, Trigger: trigger, OrderingIndex: index, Rate: rate}
	}
	results := []Result{
		run(1, SystemRelay, &yes, &no, 900), run(1, SystemRelay, &no, &no, 1000),
		run(1, SystemRelay, &yes, &no, 700), run(1, SystemRelay, &no, &no, 1000),
		run(8, SystemRelay, &yes, &no, 3000), run(8, SystemRelay, &no, &no, 4000),
		run(8, SystemRelay, &yes, &no, 5000), run(8, SystemRelay, &no, &no, 4000),
		run(1, SystemKeyscan, &yes, &yes, 600), run(1, SystemKeyscan, &yes, &yes, 1000),
	}
	require.Equal(t, []ProducerRatio{
		{Concurrency: 1, WithTrigger: 800, WithoutTrigger: 1000, Pct: 80, PairPct: []float64{90, 70},
			WithIndex: ptr(800.0), IndexPct: ptr(100.0)},
		{Concurrency: 8, WithTrigger: 4000, WithoutTrigger: 4000, Pct: 100, PairPct: []float64{75, 125}},
	}, ComputeRatios(results).Producer)
}

func TestIdleRatioIsTheRelaysP50AboveTheCeilings(t *testing.T) {
	t.Parallel()
	results := []Result{
		{Workload: WorkloadIdle, System: SystemRelay, Latency: &Latency{P50: 1.5}},
		{Workload: WorkloadIdle, System: SystemNaive, Latency: &Latency{P50: 600}},
		{Workload: WorkloadIdle, System: SystemCeiling, Latency: &Latency{P50: 0.75}},
	}
	require.Equal(t, ptr(0.75), ComputeRatios(results).IdleRelayOverCeilingMS)
	require.Nil(t, ComputeRatios(results[:2]).IdleRelayOverCeilingMS, "no ceiling run, no ratio")
}

func TestOverCeilingPairsEachRateAndStepWithTheCeilings(t *testing.T) {
	t.Parallel()
	results := []Result{
		{Workload: WorkloadSteady, System: SystemRelay, TargetRate: 1000, Latency: &Latency{P50: 2, P99: 8, P999: 20}},
		{Workload: WorkloadSteady, System: SystemNaive, TargetRate: 1000, Latency: &Latency{P50: 600, P99: 900, P999: 990}},
		{Workload: WorkloadSteady, System: SystemRelay, TargetRate: 5000, Latency: &Latency{P50: 3, P99: 9, P999: 30}},
		{Workload: WorkloadSteps, System: SystemRelay, TargetRate: 300, Step: 1, Latency: &Latency{P50: 1, P99: 3, P999: 6}},
		{Workload: WorkloadSteps, System: SystemRelay, TargetRate: 300, Step: 3, Latency: &Latency{P50: 1.5, P99: 4, P999: 7}},
		{Workload: WorkloadSteady, System: SystemCeiling, TargetRate: 1000, Latency: &Latency{P50: 0.5, P99: 1.5, P999: 4}},
		{Workload: WorkloadSteps, System: SystemCeiling, TargetRate: 300, Step: 1, Latency: &Latency{P50: 0.25, P99: 1, P999: 2}},
		{Workload: WorkloadSteps, System: SystemCeiling, TargetRate: 300, Step: 3, Latency: &Latency{P50: 0.5, P99: 2, P999: 3}},
	}
	require.Equal(t, []LatencyGap{
		{Workload: WorkloadSteady, Rate: 1000, P50MS: 1.5, P99MS: 6.5, P999MS: 16},
		{Workload: WorkloadSteps, Rate: 300, Step: 1, P50MS: 0.75, P99MS: 2, P999MS: 4},
		{Workload: WorkloadSteps, Rate: 300, Step: 3, P50MS: 1, P99MS: 2, P999MS: 4},
	}, ComputeRatios(results).OverCeiling, "5,000/s has no ceiling row, and each step pairs with its own")
}

func TestBurstRatiosCompareTheTriggeredArmToEachBaseline(t *testing.T) {
	t.Parallel()
	burst := func(arm string, first, whole float64) Result {
		return Result{Workload: WorkloadBursts, BurstArm: arm, FirstSecondRate: &first, Rate: whole}
	}
	results := []Result{
		burst(BurstTriggered, 600, 900), burst(BurstResting, 1000, 1000), burst(BurstPolling, 800, 900),
		burst(BurstTriggered, 900, 900), burst(BurstResting, 1000, 1000), burst(BurstPolling, 1000, 900),
	}
	require.Equal(t, []BurstRatio{
		{Baseline: BurstResting, FirstSecondPct: 75, WholePct: 90, PairFirstSecondPct: []float64{60, 90}},
		{Baseline: BurstPolling, FirstSecondPct: 750.0 / 9, WholePct: 100, PairFirstSecondPct: []float64{75, 90}},
	}, ComputeRatios(results).Bursts)
	require.Empty(t, ComputeRatios(results[:1]).Bursts, "no baseline, no ratio")
}
