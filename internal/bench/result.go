package bench

// Result is one row of the report: one workload on one system. Figures that
// do not apply, or were not measured, are nil (null in JSON, "-" in the
// table).
type Result struct {
	// Workload is drain, steady, idle, producer, ordered, scale,
	// scheduled or horizon.
	Workload string `json:"workload"`
	// System is relay, naive, ceiling or keyscan (the ordered relay).
	System string `json:"system"`
	// TargetRate is the steady workload's target, events per second (the
	// ordered steady run's, the horizon workload's).
	TargetRate int `json:"target_rate,omitempty"`
	// IntervalMS is the idle workload's time between events.
	IntervalMS float64 `json:"interval_ms,omitempty"`
	// Concurrency is the producer workload's connection count.
	Concurrency int `json:"concurrency,omitempty"`
	// Trigger tells whether the producer workload ran with the outbox's
	// insert triggers enabled.
	Trigger *bool `json:"trigger,omitempty"`
	// OrderingIndex tells whether the producer workload ran with the
	// ordering index (and the ordered relay that created it).
	OrderingIndex *bool `json:"ordering_index,omitempty"`
	// Aggregates is how many aggregates the ordered or horizon workload's
	// events are spread over.
	Aggregates int `json:"aggregates,omitempty"`
	// Relays is how many relays drained side by side (scale).
	Relays int `json:"relays,omitempty"`
	// PerAggregate is how many events each aggregate has in an ordered
	// drain's backlog.
	PerAggregate int `json:"per_aggregate,omitempty"`
	// Phase is the horizon workload's phase the window belongs to: before,
	// pinned or after.
	Phase string `json:"phase,omitempty"`
	// Window numbers the horizon workload's windows within their phase,
	// from 1.
	Window int `json:"window,omitempty"`
	// Burst numbers the bursts workload's rounds of bursts, from 1.
	Burst int `json:"burst,omitempty"`
	// BurstArm is the bursts workload's arm: BurstTriggered,
	// BurstResting or BurstPolling.
	BurstArm string `json:"burst_arm,omitempty"`
	// Step numbers the steps workload's steps, from 1.
	Step int `json:"step,omitempty"`

	// Committed is how many events producers committed (or the backlog
	// written for a drain, or the messages the ceiling published).
	Committed int64 `json:"committed"`
	// Events is how many distinct events arrived at the consumer, or, for
	// the producer workload, how many rows were inserted.
	Events int64 `json:"events"`
	// Seconds is the measured time the rate is taken over.
	Seconds float64 `json:"seconds"`
	// Rate is events per second: delivered (drain), committed by the
	// producers (steady, idle, bursts, steps) or inserted (producer).
	Rate float64 `json:"rate"`
	// FirstSecondRate is the bursts workload's commit rate over the first
	// second of the burst.
	FirstSecondRate *float64 `json:"first_second_rate,omitempty"`
	// Latency is commit → consumer over the events that arrived (steady,
	// idle), or due time → consumer (scheduled).
	Latency *Latency `json:"latency_ms"`
	// Lost is how many committed events never arrived within the wait;
	// nil where the system is not waited for.
	Lost *int64 `json:"lost"`
	// Duplicates is how many deliveries repeated an event.
	Duplicates int64 `json:"duplicates"`
	// OutOfOrder is how many first arrivals came before the first arrival
	// of an earlier event of their aggregate, or said another aggregate or
	// seq than was written (ordered workload, every system; must be 0 for
	// keyscan); nil where order is not checked.
	OutOfOrder *int64 `json:"out_of_order"`
	// Early is how many events arrived before their time (scheduled
	// workload; must be 0); nil elsewhere.
	Early *int64 `json:"early,omitempty"`
	// Backlog is how many rows were pending when the producers stopped
	// (steady, idle) or when the naive drain ended.
	Backlog *int64 `json:"backlog"`
	// Cost is the CPU and memory the system used (relay and naive, in drain
	// and steady; the relay while the producers insert, per 1,000 rows
	// inserted, in the producer workload; in a horizon window, the relay
	// and every backend of the database, see Cost.PGCPUPer1k).
	Cost *Cost `json:"cost"`

	// The horizon workload's figures: for the others, nil.

	// Claim is the relay's claim time over the window, from its
	// outboxrelay_claim_duration_seconds histogram, those claims that
	// found nothing included.
	Claim *ClaimTime `json:"claim_ms"`
	// Pending is how many rows were pending at the window's end, counted
	// (count(*)) after the window's cost was read and outside it.
	Pending *int64 `json:"pending"`
	// DeadTuples is the outbox table's n_dead_tup (pg_stat_user_tables) at
	// the window's end: statistics the server updates about once a second.
	DeadTuples *int64 `json:"dead_tuples"`
}

// ClaimTime is how long claims took, in milliseconds.
type ClaimTime struct {
	// Mean is their mean, from the histogram's sum and count.
	Mean float64 `json:"mean"`
	// P99Bound is the upper bound of the histogram bucket that holds their
	// 99th percentile: not the percentile, a bound of it (the relay's
	// buckets run from 0.25 ms to 5 s, 2 to 2.5 times apart). Nil if it
	// is above the largest bound.
	P99Bound *float64 `json:"p99_bound"`
}

// Latency is a latency distribution in milliseconds.
type Latency struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
}

// Cost is what a relay process and its PostgreSQL backends spent on a run.
type Cost struct {
	// RelayCPUPer1k is the relay process's user+system CPU, milliseconds
	// per 1,000 events delivered.
	RelayCPUPer1k float64 `json:"relay_cpu_ms_per_1k"`
	// PGCPUPer1k is the CPU of the relay's PostgreSQL backends, milliseconds
	// per 1,000 events; nil when they cannot be read (PostgreSQL on another
	// machine or in another PID namespace). In a horizon window it is the
	// CPU of every client backend of the benchmark's database but the
	// benchmark's own statements': the relay's, the producers' and the
	// pinning transaction's (as issue 29's figures counted them), and
	// anything else connected to that database. Autovacuum workers are
	// not counted.
	PGCPUPer1k *float64 `json:"pg_cpu_ms_per_1k"`
	// TotalPer1k is their sum (the relay's alone when PGCPUPer1k is nil).
	TotalPer1k float64 `json:"total_cpu_ms_per_1k"`
	// PeakRSSMiB is the relay process's peak resident memory (VmHWM).
	PeakRSSMiB float64 `json:"peak_rss_mib"`
	// WALPerEvent is the WAL the whole PostgreSQL server wrote during the
	// run, bytes per event: with nothing else writing, the system's
	// statements (claims, marks, their full-page images after a
	// checkpoint), plus the producers' inserts where they insert during
	// the run (steady, producer). Unlike
	// CPU it hardly moves with the machine's load, so it compares builds
	// across the machine's phases.
	WALPerEvent float64 `json:"wal_bytes_per_event"`
	// ClaimsPer1k is how many claims the relay made per 1,000 events,
	// those that found nothing included, from its metrics; nil for the
	// naive poller and where --relay-arg turns the metrics off
	// (--http-addr=). At a steady rate it
	// tells the gate's regime: about 1,000 with the gate open (a claim per
	// notification), fewer with it closed (a claim per busy poll).
	ClaimsPer1k *float64 `json:"claims_per_1k"`
	// GateCloses is how many times the relay closed its notification gate
	// during the run (outboxrelay_gate_closes_total), known where
	// ClaimsPer1k is. A relay that flaps between its busy and idle regimes
	// closes it again and again.
	GateCloses *float64 `json:"gate_closes"`
	// AllocsPerEvent is the relay's heap allocations per event
	// (go_memstats_mallocs_total), known where ClaimsPer1k is. It counts
	// the work of the Go code, the relay's and its libraries', and, like
	// WALPerEvent, hardly moves with the machine's load: the relay's CPU
	// figure for comparing builds across the machine's phases. It
	// includes the metrics' own scrapes, two a run.
	AllocsPerEvent *float64 `json:"relay_allocs_per_event"`
}

// Ratios relate the results to each other.
type Ratios struct {
	// DrainRelayVsCeilingPct is the relay's drain rate as a percentage of
	// the broker ceiling's.
	DrainRelayVsCeilingPct *float64 `json:"drain_relay_vs_ceiling_pct"`
	// DrainRelayVsNaiveX is the relay's drain rate as a multiple of the
	// naive poller's.
	DrainRelayVsNaiveX *float64 `json:"drain_relay_vs_naive_x"`
	// IdleRelayOverCeilingMS is how much the relay's idle p50 exceeds the
	// broker ceiling's: what the outbox path adds to a quiet system's
	// latency.
	IdleRelayOverCeilingMS *float64 `json:"idle_relay_over_ceiling_ms"`
	// Producer compares insert rates with and without the insert triggers,
	// and with and without the ordering index.
	Producer []ProducerRatio `json:"producer"`
	// Ordered compares, per ordered drain shape, the ordered relay's rate
	// with each design to the relay's on the same backlog.
	Ordered []OrderedRatio `json:"ordered"`
	// Horizon compares the horizon workload's last pinned window with its
	// baseline; nil without that workload.
	Horizon *HorizonRatio `json:"horizon"`
	// Bursts compares the bursts workload's producers with the triggers to
	// each baseline without them; empty without that workload.
	Bursts []BurstRatio `json:"bursts"`
	// OverCeiling is, for each steady rate and each step, how much the
	// relay's latency exceeds the broker ceiling's at the same rate on the
	// same schedule.
	OverCeiling []LatencyGap `json:"over_ceiling"`
}

// LatencyGap is the relay's latency above the broker ceiling's in one
// steady run or one step: Relay − Ceiling, in ms.
type LatencyGap struct {
	Workload string  `json:"workload"`
	Rate     int     `json:"rate"`
	Step     int     `json:"step,omitempty"`
	P50MS    float64 `json:"p50_ms"`
	P99MS    float64 `json:"p99_ms"`
	P999MS   float64 `json:"p999_ms"`
}

// BurstRatio compares the bursts workload's commit rates with the
// triggers to those of one baseline without them (Baseline: BurstResting
// or BurstPolling), as percentages of the mean rates, over the bursts'
// first seconds and over the whole bursts.
type BurstRatio struct {
	Baseline       string  `json:"baseline"`
	FirstSecondPct float64 `json:"first_second_pct"`
	WholePct       float64 `json:"whole_pct"`
	// PairFirstSecondPct is each round's first-second ratio, in the order
	// they ran.
	PairFirstSecondPct []float64 `json:"pair_first_second_pct"`
}

// HorizonRatio compares the last window of the horizon workload's pinned
// phase with its baseline, the mean of its before windows' figures: a
// typical window of the same length, not the before windows pooled. Issue
// 29 asks for claim time and CPU per event within 1.5× of the baseline,
// lag p99 within 2×, and pending rows that do not grow.
type HorizonRatio struct {
	// Before is how many before windows make the baseline.
	Before int `json:"before"`
	// Window is the pinned window compared, the last.
	Window int `json:"window"`
	// ClaimMeanMS compares the mean claim times; nil where the relay's
	// metrics were not read.
	ClaimMeanMS *Comparison `json:"claim_mean_ms"`
	// CPUPer1k compares the CPU per 1,000 events, the relay's and the
	// database's backends' (Cost.TotalPer1k).
	CPUPer1k *Comparison `json:"cpu_ms_per_1k"`
	// LagP99MS compares the event lag p99s (commit → consumer).
	LagP99MS *Comparison `json:"lag_p99_ms"`
	// PendingBefore and PendingPinned are the pending rows at the end of
	// the last before window and of the last pinned window.
	PendingBefore *int64 `json:"pending_before"`
	PendingPinned *int64 `json:"pending_pinned"`
}

// Comparison is a figure of the baseline and of a later window, and their
// ratio (Pinned / Baseline; nil if the baseline is 0).
type Comparison struct {
	Baseline float64  `json:"baseline"`
	Pinned   float64  `json:"pinned"`
	X        *float64 `json:"x"`
}

// ProducerRatio compares inserts per second at one concurrency. Each rate
// is the mean of that case's runs.
type ProducerRatio struct {
	Concurrency    int     `json:"concurrency"`
	WithTrigger    float64 `json:"with_trigger"`
	WithoutTrigger float64 `json:"without_trigger"`
	// Pct is WithTrigger as a percentage of WithoutTrigger.
	Pct float64 `json:"pct"`
	// PairPct is each pair's run with the trigger as a percentage of the
	// run without it that followed, in the order they ran.
	PairPct []float64 `json:"pair_pct"`
	// WithIndex is the rate with the trigger and the ordering index.
	WithIndex *float64 `json:"with_index,omitempty"`
	// IndexPct is WithIndex as a percentage of WithTrigger.
	IndexPct *float64 `json:"index_pct,omitempty"`
}

// OrderedRatio compares the drains of one ordered shape, events per second.
type OrderedRatio struct {
	Shape     string  `json:"shape"`
	Unordered float64 `json:"unordered"`
	Keyscan   float64 `json:"keyscan"`
	// KeyscanPct is Keyscan as a percentage of Unordered.
	KeyscanPct *float64 `json:"keyscan_pct"`
}

// ComputeRatios derives the ratios from results; a ratio whose rows are
// missing is nil or left out.
func ComputeRatios(results []Result) Ratios {
	var r Ratios
	rate := func(workload, system string) float64 {
		for _, res := range results {
			if res.Workload == workload && res.System == system {
				return res.Rate
			}
		}
		return 0
	}
	relay, ceiling, naive := rate(WorkloadDrain, SystemRelay), rate(WorkloadDrain, SystemCeiling), rate(WorkloadDrain, SystemNaive)
	if relay > 0 && ceiling > 0 {
		r.DrainRelayVsCeilingPct = ptr(100 * relay / ceiling)
	}
	if relay > 0 && naive > 0 {
		r.DrainRelayVsNaiveX = ptr(relay / naive)
	}
	if relay, ceiling := p50(results, WorkloadIdle, SystemRelay), p50(results, WorkloadIdle, SystemCeiling); relay != nil && ceiling != nil {
		r.IdleRelayOverCeilingMS = ptr(*relay - *ceiling)
	}
	r.Producer = producerRatios(results)
	r.Ordered = orderedRatios(results)
	r.Horizon = horizonRatio(results)
	r.Bursts = burstRatio(results)
	r.OverCeiling = overCeiling(results)
	return r
}

// overCeiling pairs each steady and steps row of the relay with the
// ceiling's row of the same rate and step.
func overCeiling(results []Result) []LatencyGap {
	type key struct {
		workload   string
		rate, step int
	}
	ceiling := map[key]*Latency{}
	for _, res := range results {
		if res.System == SystemCeiling && res.Latency != nil && (res.Workload == WorkloadSteady || res.Workload == WorkloadSteps) {
			ceiling[key{res.Workload, res.TargetRate, res.Step}] = res.Latency
		}
	}
	var out []LatencyGap
	for _, res := range results {
		if res.System != SystemRelay || res.Latency == nil {
			continue
		}
		c, ok := ceiling[key{res.Workload, res.TargetRate, res.Step}]
		if !ok {
			continue
		}
		out = append(out, LatencyGap{
			Workload: res.Workload, Rate: res.TargetRate, Step: res.Step,
			P50MS: res.Latency.P50 - c.P50, P99MS: res.Latency.P99 - c.P99, P999MS: res.Latency.P999 - c.P999,
		})
	}
	return out
}

// burstRatio compares the bursts with the triggers to each baseline that
// ran.
func burstRatio(results []Result) []BurstRatio {
	first, whole := map[string][]float64{}, map[string][]float64{}
	for _, res := range results {
		if res.Workload != WorkloadBursts || res.FirstSecondRate == nil {
			continue
		}
		first[res.BurstArm] = append(first[res.BurstArm], *res.FirstSecondRate)
		whole[res.BurstArm] = append(whole[res.BurstArm], res.Rate)
	}
	var out []BurstRatio
	for _, base := range []string{BurstResting, BurstPolling} {
		if mean(first[base]) <= 0 || mean(whole[base]) <= 0 {
			continue
		}
		b := BurstRatio{
			Baseline:       base,
			FirstSecondPct: 100 * mean(first[BurstTriggered]) / mean(first[base]),
			WholePct:       100 * mean(whole[BurstTriggered]) / mean(whole[base]),
		}
		for i := range min(len(first[BurstTriggered]), len(first[base])) {
			if first[base][i] > 0 {
				b.PairFirstSecondPct = append(b.PairFirstSecondPct, 100*first[BurstTriggered][i]/first[base][i])
			}
		}
		out = append(out, b)
	}
	return out
}

// horizonRatio compares the horizon workload's last pinned window with
// the mean of its before windows; nil without both.
func horizonRatio(results []Result) *HorizonRatio {
	var before []Result
	var last *Result
	for i, res := range results {
		switch {
		case res.Workload != WorkloadHorizon:
		case res.Phase == PhaseBefore:
			before = append(before, res)
		case res.Phase == PhasePinned && (last == nil || res.Window > last.Window):
			last = &results[i]
		}
	}
	if len(before) == 0 || last == nil {
		return nil
	}
	h := &HorizonRatio{Before: len(before), Window: last.Window, PendingBefore: before[len(before)-1].Pending, PendingPinned: last.Pending}
	// compare compares figure f, nil where some window lacks it.
	compare := func(f func(Result) *float64) *Comparison {
		pinned := f(*last)
		if pinned == nil {
			return nil
		}
		base := make([]float64, len(before))
		for i, res := range before {
			v := f(res)
			if v == nil {
				return nil
			}
			base[i] = *v
		}
		c := &Comparison{Baseline: mean(base), Pinned: *pinned}
		if c.Baseline > 0 {
			c.X = ptr(c.Pinned / c.Baseline)
		}
		return c
	}
	h.ClaimMeanMS = compare(func(r Result) *float64 {
		if r.Claim == nil {
			return nil
		}
		return &r.Claim.Mean
	})
	h.CPUPer1k = compare(func(r Result) *float64 {
		if r.Cost == nil {
			return nil
		}
		return &r.Cost.TotalPer1k
	})
	h.LagP99MS = compare(func(r Result) *float64 {
		if r.Latency == nil {
			return nil
		}
		return &r.Latency.P99
	})
	return h
}

// p50 is the latency p50 of the run of workload on system, if any.
func p50(results []Result, workload, system string) *float64 {
	for _, res := range results {
		if res.Workload == workload && res.System == system && res.Latency != nil {
			return ptr(res.Latency.P50)
		}
	}
	return nil
}

func producerRatios(results []Result) []ProducerRatio {
	with, without, index := map[int][]float64{}, map[int][]float64{}, map[int][]float64{}
	var order []int
	for _, res := range results {
		switch {
		case res.Workload != WorkloadProducer || res.Trigger == nil:
		case res.OrderingIndex != nil && *res.OrderingIndex:
			if *res.Trigger {
				index[res.Concurrency] = append(index[res.Concurrency], res.Rate)
			}
		case *res.Trigger:
			if _, seen := with[res.Concurrency]; !seen {
				order = append(order, res.Concurrency)
			}
			with[res.Concurrency] = append(with[res.Concurrency], res.Rate)
		default:
			without[res.Concurrency] = append(without[res.Concurrency], res.Rate)
		}
	}
	var out []ProducerRatio
	for _, c := range order {
		w, wo := mean(with[c]), mean(without[c])
		if wo <= 0 {
			continue
		}
		p := ProducerRatio{Concurrency: c, WithTrigger: w, WithoutTrigger: wo, Pct: 100 * w / wo}
		for i := range min(len(with[c]), len(without[c])) {
			if without[c][i] > 0 {
				p.PairPct = append(p.PairPct, 100*with[c][i]/without[c][i])
			}
		}
		if wi := mean(index[c]); wi > 0 && w > 0 {
			p.WithIndex, p.IndexPct = ptr(wi), ptr(100*wi/w)
		}
		out = append(out, p)
	}
	return out
}

// mean is the mean of xs, 0 for none.
func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}

func orderedRatios(results []Result) []OrderedRatio {
	var out []OrderedRatio
	for _, res := range results {
		if res.Workload != WorkloadOrdered || res.PerAggregate == 0 || res.System != SystemRelay {
			continue
		}
		o := OrderedRatio{Shape: Shape{res.Aggregates, res.PerAggregate}.String(), Unordered: res.Rate}
		for _, other := range results {
			if other.Workload != WorkloadOrdered || other.Aggregates != res.Aggregates || other.PerAggregate != res.PerAggregate {
				continue
			}
			if other.System == SystemKeyscan {
				o.Keyscan = other.Rate
			}
		}
		if o.Unordered > 0 && o.Keyscan > 0 {
			o.KeyscanPct = ptr(100 * o.Keyscan / o.Unordered)
		}
		out = append(out, o)
	}
	return out
}

func ptr[T any](v T) *T { return &v }
