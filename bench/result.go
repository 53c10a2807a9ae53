package bench

// Result is one row of the report: one workload on one system. Figures that
// do not apply, or were not measured, are nil (null in JSON, "-" in the
// table).
type Result struct {
	// Workload is drain, steady, idle, producer, ordered or scale.
	Workload string `json:"workload"`
	// System is relay, naive, ceiling, keyscan or distinct (the last two
	// are the ordered relay with that design).
	System string `json:"system"`
	// TargetRate is the steady workload's target, events per second.
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
	// Aggregates is how many aggregates the ordered workload's events are
	// spread over.
	Aggregates int `json:"aggregates,omitempty"`
	// Relays is how many relays drained side by side (scale).
	Relays int `json:"relays,omitempty"`
	// PerAggregate is how many events each aggregate has in an ordered
	// drain's backlog.
	PerAggregate int `json:"per_aggregate,omitempty"`

	// Committed is how many events producers committed (or the backlog
	// written for a drain, or the messages the ceiling published).
	Committed int64 `json:"committed"`
	// Events is how many distinct events arrived at the consumer, or, for
	// the producer workload, how many rows were inserted.
	Events int64 `json:"events"`
	// Seconds is the measured time the rate is taken over.
	Seconds float64 `json:"seconds"`
	// Rate is events per second: delivered (drain), committed by the
	// producers (steady, idle) or inserted (producer).
	Rate float64 `json:"rate"`
	// Latency is commit → consumer over the events that arrived (steady,
	// idle).
	Latency *Latency `json:"latency_ms"`
	// Lost is how many committed events never arrived within the wait;
	// nil where the system is not waited for.
	Lost *int64 `json:"lost"`
	// Duplicates is how many deliveries repeated an event.
	Duplicates int64 `json:"duplicates"`
	// OutOfOrder is how many first arrivals came before the first arrival
	// of an earlier event of their aggregate, or said another aggregate or
	// seq than was written (ordered workload, every system; must be 0 for
	// keyscan and distinct); nil where order is not checked.
	OutOfOrder *int64 `json:"out_of_order"`
	// Backlog is how many rows were pending when the producers stopped
	// (steady, idle) or when the naive drain ended.
	Backlog *int64 `json:"backlog"`
	// Cost is the CPU and memory the system used (relay and naive, in drain
	// and steady; the relay while the producers insert, per 1,000 rows
	// inserted, in the producer workload).
	Cost *Cost `json:"cost"`
}

// Latency is a latency distribution in milliseconds.
type Latency struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// Cost is what a relay process and its PostgreSQL backends spent on a run.
type Cost struct {
	// RelayCPUPer1k is the relay process's user+system CPU, milliseconds
	// per 1,000 events delivered.
	RelayCPUPer1k float64 `json:"relay_cpu_ms_per_1k"`
	// PGCPUPer1k is the CPU of the relay's PostgreSQL backends, milliseconds
	// per 1,000 events; nil when they cannot be read (PostgreSQL on another
	// machine or in another PID namespace).
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
	Distinct  float64 `json:"distinct"`
	// KeyscanPct and DistinctPct are those rates as percentages of
	// Unordered.
	KeyscanPct  *float64 `json:"keyscan_pct"`
	DistinctPct *float64 `json:"distinct_pct"`
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
	return r
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
			switch other.System {
			case SystemKeyscan:
				o.Keyscan = other.Rate
			case SystemDistinct:
				o.Distinct = other.Rate
			}
		}
		if o.Unordered > 0 {
			if o.Keyscan > 0 {
				o.KeyscanPct = ptr(100 * o.Keyscan / o.Unordered)
			}
			if o.Distinct > 0 {
				o.DistinctPct = ptr(100 * o.Distinct / o.Unordered)
			}
		}
		out = append(out, o)
	}
	return out
}

func ptr[T any](v T) *T { return &v }
