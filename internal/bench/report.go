package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteMachine prints the machine and the settings the results came from.
func WriteMachine(w io.Writer, m Machine, cfg Config) error {
	_, err := fmt.Fprintf(w, "machine:    %s × %d, %d MiB, %s\nsoftware:   %s, PostgreSQL %s, RabbitMQ %s\nbench:      %s\n\n",
		m.CPU, m.CPUs, m.MemoryMiB, m.Kernel, m.Go, m.PostgreSQL, m.RabbitMQ, strings.Join(cfg.Flags(), " "))
	return err
}

// WriteTable prints one line per result. The last four columns are the
// horizon workload's: claim mean and the bound of the bucket holding the
// claims' p99 (see ClaimTime), pending rows and the table's dead tuples at
// the window's end.
func WriteTable(w io.Writer, results []Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tsystem\tevents\trate/s\tp50\tp90\tp99\tp99.9\tmax (ms)\tlost\tdup\tout of order\tearly\tbacklog\tcpu ms/1k (relay+pg)\twal B/event\tclaims/1k\tgate closes\tallocs/event\trss MiB\tclaim mean\tclaim p99≤ (ms)\tpending\tdead tuples\t")
	for _, r := range results {
		p50, p90, p99, p999, pmax := "-", "-", "-", "-", "-"
		if l := r.Latency; l != nil {
			p50, p90, p99, p999, pmax = num(l.P50), num(l.P90), num(l.P99), num(l.P999), num(l.Max)
		}
		cpu, wal, claims, closes, allocs, rss := "-", "-", "-", "-", "-", "-"
		if c := r.Cost; c != nil {
			if c.ClaimsPer1k != nil {
				claims = num(*c.ClaimsPer1k)
			}
			if c.GateCloses != nil {
				closes = strconv.FormatFloat(*c.GateCloses, 'f', 0, 64)
			}
			if c.AllocsPerEvent != nil {
				allocs = num(*c.AllocsPerEvent)
			}
			cpu = num(c.RelayCPUPer1k) + "+?"
			if c.PGCPUPer1k != nil {
				cpu = num(c.RelayCPUPer1k) + "+" + num(*c.PGCPUPer1k) + "=" + num(c.TotalPer1k)
			}
			rss = num(c.PeakRSSMiB)
			wal = strconv.FormatFloat(c.WALPerEvent, 'f', 0, 64)
		}
		claimMean, claimP99 := "-", "-"
		if c := r.Claim; c != nil {
			claimMean, claimP99 = num(c.Mean), "> max"
			if c.P99Bound != nil {
				claimP99 = num(*c.P99Bound)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			label(r), r.System, r.Events, num(r.Rate), p50, p90, p99, p999, pmax, optional(r.Lost), r.Duplicates, optional(r.OutOfOrder), optional(r.Early), optional(r.Backlog), cpu, wal, claims, closes, allocs, rss,
			claimMean, claimP99, optional(r.Pending), optional(r.DeadTuples))
	}
	return tw.Flush()
}

// WriteRatios prints the ratios section.
func WriteRatios(w io.Writer, r Ratios) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\nratios")
	pct := func(p *float64, unit string) string {
		if p == nil {
			return "-"
		}
		return num(*p) + " " + unit
	}
	fmt.Fprintf(tw, "  drain relay/ceiling\t%s\n", pct(r.DrainRelayVsCeilingPct, "%"))
	fmt.Fprintf(tw, "  drain relay/naive\t%s\n", pct(r.DrainRelayVsNaiveX, "×"))
	fmt.Fprintf(tw, "  idle p50 relay − ceiling\t%s\n", pct(r.IdleRelayOverCeilingMS, "ms"))
	for _, p := range r.Producer {
		pairs := make([]string, len(p.PairPct))
		for i, pct := range p.PairPct {
			pairs[i] = num(pct) + " %"
		}
		fmt.Fprintf(tw, "  producer c=%d with/without trigger\t%s %%\t(%s/s vs %s/s; pairs %s)\n",
			p.Concurrency, num(p.Pct), num(p.WithTrigger), num(p.WithoutTrigger), strings.Join(pairs, ", "))
	}
	for _, p := range r.Producer {
		if p.IndexPct != nil {
			fmt.Fprintf(tw, "  producer c=%d with/without ordering index\t%s %%\t(%s/s vs %s/s)\n", p.Concurrency, num(*p.IndexPct), num(*p.WithIndex), num(p.WithTrigger))
		}
	}
	for _, o := range r.Ordered {
		fmt.Fprintf(tw, "  ordered %s keyscan/relay\t%s\t(%s/s vs %s/s)\n", o.Shape, pct(o.KeyscanPct, "%"), num(o.Keyscan), num(o.Unordered))
	}
	for _, b := range r.Bursts {
		pairs := make([]string, len(b.PairFirstSecondPct))
		for i, pct := range b.PairFirstSecondPct {
			pairs[i] = num(pct) + " %"
		}
		fmt.Fprintf(tw, "  bursts triggered/%s relay, first second\t%s %%\t(rounds %s)\n", b.Baseline, num(b.FirstSecondPct), strings.Join(pairs, ", "))
		fmt.Fprintf(tw, "  bursts triggered/%s relay, whole burst\t%s %%\n", b.Baseline, num(b.WholePct))
	}
	for _, g := range r.OverCeiling {
		what := label(Result{Workload: g.Workload, TargetRate: g.Rate, Step: g.Step})
		fmt.Fprintf(tw, "  %s p50 / p99 / p99.9 relay − ceiling\t%s / %s / %s ms\n", what, num(g.P50MS), num(g.P99MS), num(g.P999MS))
	}
	if h := r.Horizon; h != nil {
		versus := func(what string, c *Comparison, unit, asked string) {
			if c == nil {
				fmt.Fprintf(tw, "  horizon pinned %d/before %s\t-\n", h.Window, what)
				return
			}
			fmt.Fprintf(tw, "  horizon pinned %d/before %s\t%s\t(%s vs %s %s; issue 29 asks at most %s)\n",
				h.Window, what, pct(c.X, "×"), num(c.Pinned), num(c.Baseline), unit, asked)
		}
		versus("claim mean", h.ClaimMeanMS, "ms", "1.5×")
		versus("cpu/event", h.CPUPer1k, "ms/1k, relay + database backends", "1.5×")
		versus("lag p99", h.LagP99MS, "ms", "2×")
		fmt.Fprintf(tw, "  horizon pending before %d → pinned %d\t%s → %s\t(issue 29 asks that it not grow)\n",
			h.Before, h.Window, optional(h.PendingBefore), optional(h.PendingPinned))
	}
	return tw.Flush()
}

// AppendJSON appends the run to the file at path as JSON lines: the
// machine and settings, one object per result, then the ratios. Every line
// carries the run's start time as "run".
func AppendJSON(path string, started time.Time, m Machine, cfg Config, results []Result, ratios Ratios) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("json results: %w", err)
	}
	run := started.UTC().Format(time.RFC3339)
	enc := json.NewEncoder(f)
	err = enc.Encode(struct {
		Run     string   `json:"run"`
		Machine Machine  `json:"machine"`
		Flags   []string `json:"flags"`
	}{run, m, cfg.Flags()})
	for _, r := range results {
		if err != nil {
			break
		}
		err = enc.Encode(struct {
			Run string `json:"run"`
			Result
		}{run, r})
	}
	if err == nil {
		err = enc.Encode(struct {
			Run    string `json:"run"`
			Ratios Ratios `json:"ratios"`
		}{run, ratios})
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("json results %s: %w", path, err)
	}
	return nil
}

// label names a result's workload with its parameter.
func label(r Result) string {
	switch {
	case r.Workload == WorkloadHorizon:
		return horizonLabel(r)
	case r.Workload == WorkloadScale:
		return r.Workload + " " + strconv.Itoa(r.Relays) + "×"
	case r.Workload == WorkloadScheduled:
		return r.Workload + " " + strconv.FormatInt(r.Committed, 10) + " over " + time.Duration(r.Seconds*float64(time.Second)).String()
	case r.Workload == WorkloadSteps:
		return r.Workload + " #" + strconv.Itoa(r.Step) + " " + strconv.Itoa(r.TargetRate) + "/s"
	case r.Workload == WorkloadOrdered && r.TargetRate > 0:
		return r.Workload + " " + strconv.Itoa(r.TargetRate) + "/s over " + strconv.Itoa(r.Aggregates)
	case r.Workload == WorkloadOrdered:
		return r.Workload + " " + Shape{r.Aggregates, r.PerAggregate}.String()
	case r.TargetRate > 0:
		return r.Workload + " " + strconv.Itoa(r.TargetRate) + "/s"
	case r.IntervalMS > 0:
		return r.Workload + " " + strconv.FormatFloat(r.IntervalMS, 'f', -1, 64) + "ms"
	case r.Workload == WorkloadBursts:
		trig := " +trigger"
		if r.Trigger != nil && !*r.Trigger {
			trig = " -trigger " + r.BurstArm
		}
		first := ""
		if r.FirstSecondRate != nil {
			first = ", 1st s " + num(*r.FirstSecondRate) + "/s"
		}
		return r.Workload + " #" + strconv.Itoa(r.Burst) + " c=" + strconv.Itoa(r.Concurrency) + trig + first
	case r.Trigger != nil:
		trig := "+trigger"
		if !*r.Trigger {
			trig = "-trigger"
		}
		if r.OrderingIndex != nil && *r.OrderingIndex {
			trig += " +index"
		}
		return r.Workload + " c=" + strconv.Itoa(r.Concurrency) + " " + trig
	}
	return r.Workload
}

func optional(n *int64) string {
	if n == nil {
		return "-"
	}
	return strconv.FormatInt(*n, 10)
}

// num prints a figure with about three significant digits, whole numbers
// from 100 up.
func num(f float64) string {
	switch a := math.Abs(f); {
	case a >= 100 || a == 0:
		return strconv.FormatFloat(f, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(f, 'f', 1, 64)
	default:
		return strconv.FormatFloat(f, 'f', 2, 64)
	}
}

// round rounds for log lines.
func round(f float64) float64 { return math.Round(f*10) / 10 }
