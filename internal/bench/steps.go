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
// relay's CPU during it per event committed in it.
func (r *runner) steps(ctx context.Context) (err error) {
	ps, sys, err := r.startProducing(ctx, r.cfg.Producers, SystemRelay)
	if err != nil {
		return err
	}
	defer ps.Close()
	defer stopSystem(sys, &err)

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
	rest := time.NewTimer(stepsRest)
	select {
	case <-rest.C:
	case <-ctx.Done():
		rest.Stop()
		return ctx.Err()
	}
	rec := r.newRecord(total)
	r.log.Info("steps: start", "rates", r.cfg.StepRates, "step", dur, "producers", ps.size())
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
	costs := make([]*Cost, len(ends))
	meter, err := beginCost(ctx, r.db, sys)
	for k := range ends {
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
		s := span{from: began + int64(time.Duration(k)*dur), to: began + int64(time.Duration(k+1)*dur)}
		costs[k], err = meter.finish(ctx, rec.committedIn(s))
		if err == nil && k+1 < len(ends) {
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
	for k, rate := range r.cfg.StepRates {
		s := span{from: began + int64(time.Duration(k)*dur), to: began + int64(time.Duration(k+1)*dur)}
		if k == len(ends)-1 {
			s.to = always.to // the last step's stragglers committed after its end
		}
		committed := rec.committedIn(s)
		r.results = append(r.results, Result{
			Workload:   WorkloadSteps,
			System:     SystemRelay,
			TargetRate: rate,
			Step:       k + 1,
			Committed:  committed,
			Events:     committed - rec.lostIn(s),
			Seconds:    dur.Seconds(),
			Rate:       float64(committed) / dur.Seconds(),
			Latency:    rec.latencyIn(s),
			Lost:       ptr(rec.lostIn(s)),
			Cost:       costs[k],
		})
	}
	r.log.Info("steps: done", "committed", w.committed, "received", rec.count())
	return nil
}
