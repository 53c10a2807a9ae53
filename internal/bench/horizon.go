package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// The horizon workload's record lasts longer than its windows at its rate:
// the producers run until the last window ends, and the moments between
// windows add to the windows: horizonSlack in all (the pin, the first
// readings), and horizonBetween after each window, whose readings (the
// pending rows, which walk the dead index entries, the dead tuples, the
// pin's check) took up to 10 s a window 30 minutes into a pin at
// 1,000/s. With a minute in all, that run's producers ran out of events
// in its 39th pinned window of 40.
const (
	horizonSlack   = time.Minute
	horizonBetween = 15 * time.Second
)

// errProducersDone is how the horizon workload's windows learn that the
// producers stopped before they were told to.
var errProducersDone = errors.New("the producers ran out of events before the last window")

// horizon runs the horizon workload: Producers connections write
// HorizonRate events per second over HorizonAggregates aggregates to the
// relay (RelayArgs included), without a break, through HorizonBefore
// windows of HorizonWindow, then as many windows as HorizonPinned takes
// (rounded up) while a REPEATABLE READ transaction in the same database
// pins the horizon, then HorizonAfter windows after it commits. Each
// window is a row. The ordering index an ordered relay created is dropped
// at the end.
func (r *runner) horizon(ctx context.Context) error {
	r.log.Info("horizon: start", "rate", r.cfg.HorizonRate, "aggregates", r.cfg.HorizonAggregates, "window", r.cfg.HorizonWindow,
		"before", r.cfg.HorizonBefore, "pinned", r.cfg.horizonPinnedWindows(), "after", r.cfg.HorizonAfter)
	results, err := r.horizonRun(ctx)
	if err != nil {
		return err
	}
	r.results = append(r.results, results...)
	r.log.Info("horizon: done", "windows", len(results))
	return r.db.dropOrderingIndex(ctx)
}

// horizonWindow is what a window measured at its end; its latency and
// lost events are taken once everything has arrived.
type horizonWindow struct {
	phase   string
	index   int
	span    span
	events  int64 // first arrivals within span
	dups    int64 // duplicate deliveries within it
	late    *int64
	cost    *Cost
	claim   *ClaimTime
	pending int64
	dead    int64
}

// horizonRun starts the relay, warms it up, runs the producers and
// measures the windows, then waits for the rest of the events.
func (r *runner) horizonRun(ctx context.Context) (_ []Result, err error) {
	cfg := r.cfg
	ps, err := r.db.connectProducers(ctx, cfg.Producers, r.payloads)
	if err != nil {
		return nil, err
	}
	defer ps.Close()
	sys, err := r.startWarm(ctx, ps, SystemRelay)
	if err != nil {
		return nil, err
	}
	defer stopSystem(sys, &err)

	nWindows := cfg.HorizonBefore + cfg.horizonPinnedWindows() + cfg.HorizonAfter
	size := int(float64(cfg.HorizonRate) * (cfg.horizonSpan() + horizonSlack + time.Duration(nWindows)*horizonBetween).Seconds())
	rec := r.newShapedRecord(size, cfg.HorizonAggregates)
	prodCtx, cancelProducers := context.WithCancel(ctx)
	stop := make(chan struct{})
	produced := make(chan error, 1)
	var committed int64
	var wg sync.WaitGroup
	wg.Go(func() {
		n, _, err := ps.pacedUntil(prodCtx, cfg.Producers, rec, r.clock, float64(cfg.HorizonRate), stop)
		committed = n
		if err == nil {
			err = errProducersDone
		}
		produced <- err
	})
	var stopOnce sync.Once
	stopProducers := func() { stopOnce.Do(func() { close(stop) }) }
	defer func() {
		stopProducers()
		cancelProducers()
		wg.Wait()
	}()

	var windows []horizonWindow
	measure := func(phase string, n int, p *pin) error {
		for i := range n {
			w, err := r.horizonMeasure(ctx, sys, rec, produced, phase, i+1, windows)
			if err != nil {
				return fmt.Errorf("%s window %d: %w", phase, i+1, err)
			}
			windows = append(windows, w)
			attrs := []any{"phase", phase, "window", i + 1, "events", w.events, "pending", w.pending, "dead_tuples", w.dead}
			if p != nil {
				age, err := p.holds(ctx, r.db)
				if err != nil {
					return fmt.Errorf("%s window %d: %w", phase, i+1, err)
				}
				attrs = append(attrs, "horizon_age", age)
			}
			r.log.Info("horizon: window", attrs...)
		}
		return nil
	}
	if err := measure(PhaseBefore, cfg.HorizonBefore, nil); err != nil {
		return nil, err
	}
	p, err := r.db.pinHorizon(ctx)
	if err != nil {
		return nil, err
	}
	defer p.close()
	if err := measure(PhasePinned, cfg.horizonPinnedWindows(), p); err != nil {
		return nil, err
	}
	if err := p.release(ctx); err != nil {
		return nil, err
	}
	if err := measure(PhaseAfter, cfg.HorizonAfter, nil); err != nil {
		return nil, err
	}

	stopProducers()
	if err := <-produced; !errors.Is(err, errProducersDone) {
		return nil, fmt.Errorf("producers: %w", err)
	}
	wg.Wait()
	if _, err := r.await(ctx, rec, committed, cfg.DrainWait, false, sys); err != nil {
		return nil, err
	}
	results := make([]Result, len(windows))
	for i, w := range windows {
		seconds := time.Duration(w.span.to - w.span.from).Seconds()
		results[i] = Result{
			Workload:   WorkloadHorizon,
			System:     SystemRelay,
			TargetRate: cfg.HorizonRate,
			Aggregates: cfg.HorizonAggregates,
			Phase:      w.phase,
			Window:     w.index,
			Committed:  rec.committedIn(w.span),
			Events:     w.events,
			Seconds:    seconds,
			Rate:       float64(w.events) / seconds,
			Latency:    rec.latencyIn(w.span),
			Lost:       ptr(rec.lostIn(w.span)),
			Duplicates: w.dups,
			OutOfOrder: w.late,
			Cost:       w.cost,
			Claim:      w.claim,
			Pending:    ptr(w.pending),
			DeadTuples: ptr(w.dead),
		}
	}
	return results, nil
}

// horizonMeasure measures one window of HorizonWindow: it begins the cost
// meter (the relay and every backend of the database but the benchmark's
// own), waits, reads the meter and counts the window's arrivals, then,
// outside the window and after its cost was read, counts the pending rows
// and reads the table's dead tuples. It fails if ctx ends, the relay
// exits, the consumer stops or the producers do. Duplicates and first
// arrivals out of order are those counted during the window (after the
// previous one, earlier).
func (r *runner) horizonMeasure(ctx context.Context, sys *system, rec *record, produced <-chan error,
	phase string, index int, earlier []horizonWindow) (horizonWindow, error) {
	w := horizonWindow{phase: phase, index: index}
	w.span.from = r.clock.now()
	end := time.Now().Add(r.cfg.HorizonWindow)
	meter, err := beginDatabaseCost(ctx, r.db, sys)
	if err != nil {
		return w, err
	}
	timer := time.NewTimer(time.Until(end))
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-ctx.Done():
		return w, ctx.Err()
	case <-sys.proc.Done():
		return w, sys.proc.exitError()
	case <-r.consumer.Done():
		return w, r.consumer.Err()
	case err := <-produced:
		return w, fmt.Errorf("producers: %w", err)
	}
	w.span.to = r.clock.now()
	closing, err := meter.end(ctx)
	if err != nil {
		return w, err
	}
	w.events = rec.receivedIn(w.span)
	w.cost = meter.cost(closing, w.events)
	if meter.metrics != "" {
		w.claim = claimTime(meter.counted, closing.counted)
	}
	var dupsBefore, lateBefore int64
	for _, e := range earlier {
		dupsBefore += e.dups
		if e.late != nil {
			lateBefore += *e.late
		}
	}
	w.dups = rec.duplicates() - dupsBefore
	if late := rec.outOfOrder(); late != nil {
		w.late = ptr(*late - lateBefore)
	}
	if w.pending, err = r.db.pending(ctx); err != nil {
		return w, err
	}
	if w.dead, err = r.db.deadTuples(ctx); err != nil {
		return w, err
	}
	return w, nil
}

// horizonLabel names a horizon window: "horizon pinned 3".
func horizonLabel(r Result) string {
	return r.Workload + " " + r.Phase + " " + strconv.Itoa(r.Window)
}
