package bench

import (
	"context"
	"time"
)

// stepsRest is how long the relay rests, nothing inserted, before the
// steps workload's first step: the load starts from nothing.
const stepsRest = time.Second

// steps runs the rate up and down without a break: Producers connections
// write, open loop, at each of StepRates for StepDuration in turn, after
// the relay has rested for stepsRest. Each step is a row: the rate the
// producers achieved, the latency of the events committed in it, and the
// relay's CPU during it per event committed in it. The broker ceiling then
// publishes on the same schedule: each step's latency floor.
func (r *runner) steps(ctx context.Context) error {
	dur := r.cfg.StepDuration
	ends := make([]int, len(r.cfg.StepRates)) // slots written by the end of each step
	total := 0
	for k, rate := range r.cfg.StepRates {
		total += max(1, int(float64(rate)*dur.Seconds()))
		ends[k] = total
	}
	due := func(i int) time.Duration {
		from := 0
		for k, end := range ends {
			if i < end {
				return time.Duration(k)*dur + time.Duration(float64(i-from)*float64(time.Second)/float64(r.cfg.StepRates[k]))
			}
			from = end
		}
		return time.Duration(len(ends)) * dur
	}
	if err := r.stepsRelay(ctx, total, due); err != nil {
		return err
	}
	r.log.Info("steps: start", "system", SystemCeiling, "rates", r.cfg.StepRates, "step", dur)
	rec, began, _, err := r.ceilingScheduled(ctx, r.cfg.Producers, total, due)
	if err != nil {
		return err
	}
	r.stepRows(SystemCeiling, rec, began, nil)
	r.log.Info("steps: done", "system", SystemCeiling, "received", rec.count())
	return nil
}

// stepsRelay is the steps workload's relay run: total events, slot i due
// at due(i).
func (r *runner) stepsRelay(ctx context.Context, total int, due func(i int) time.Duration) (err error) {
	ps, sys, err := r.startProducing(ctx, r.cfg.Producers, SystemRelay)
	if err != nil {
		return err
	}
	defer ps.Close()
	defer stopSystem(sys, &err)
	rest := time.NewTimer(stepsRest)
	select {
	case <-rest.C:
	case <-ctx.Done():
		rest.Stop()
		return ctx.Err()
	}
	dur := r.cfg.StepDuration
	rec := r.newRecord(total)
	r.log.Info("steps: start", "system", SystemRelay, "rates", r.cfg.StepRates, "step", dur, "producers", ps.size())
	began, start := r.clock.now(), time.Now()
	type written struct {
		committed int64
		err       error
	}
	done := make(chan written, 1)
	go func() {
		n, _, err := ps.scheduled(ctx, ps.size(), rec, r.clock, due, nil)
		done <- written{n, err}
	}()
	costs := make([]*Cost, len(r.cfg.StepRates))
	meter, err := beginCost(ctx, r.db, sys)
	for k := range costs {
		if err != nil {
			break
		}
		timer := time.NewTimer(time.Until(start.Add(time.Duration(k+1) * dur)))
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			err = ctx.Err()
			continue
		}
		costs[k], err = meter.finish(ctx, rec.committedIn(r.stepSpan(began, k)))
		if err == nil && k+1 < len(costs) {
			meter, err = beginCost(ctx, r.db, sys)
		}
	}
	w := <-done
	if err == nil {
		err = w.err
	}
	if err != nil {
		return err
	}
	if _, err := r.await(ctx, rec, w.committed, r.cfg.DrainWait, true, sys); err != nil {
		return err
	}
	r.stepRows(SystemRelay, rec, began, costs)
	r.log.Info("steps: done", "system", SystemRelay, "committed", w.committed, "received", rec.count())
	return nil
}

// stepSpan is step k's span of the clock, for a run that began at began.
func (r *runner) stepSpan(began int64, k int) span {
	dur := int64(r.cfg.StepDuration)
	return span{from: began + int64(k)*dur, to: began + int64(k+1)*dur}
}

// stepRows adds a result per step of a run of system that began at began,
// costs[k] (if any) the system's cost in step k.
func (r *runner) stepRows(system string, rec *record, began int64, costs []*Cost) {
	dur := r.cfg.StepDuration
	for k, rate := range r.cfg.StepRates {
		s := r.stepSpan(began, k)
		if k == len(r.cfg.StepRates)-1 {
			s.to = always.to // the last step's stragglers committed after its end
		}
		committed := rec.committedIn(s)
		res := Result{
			Workload:   WorkloadSteps,
			System:     system,
			TargetRate: rate,
			Step:       k + 1,
			Committed:  committed,
			Events:     committed - rec.lostIn(s),
			Seconds:    dur.Seconds(),
			Rate:       float64(committed) / dur.Seconds(),
			Latency:    rec.latencyIn(s),
			Lost:       ptr(rec.lostIn(s)),
		}
		if costs != nil {
			res.Cost = costs[k]
		}
		r.results = append(r.results, res)
	}
}
