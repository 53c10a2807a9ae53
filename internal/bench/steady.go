package bench

import (
	"context"
	"time"
)

// naiveSettle is how long the steady and idle workloads wait for the naive
// poller after the producers stop: it falls further behind every second,
// so waiting longer would only measure its backlog.
const naiveSettle = 2 * time.Second

// steady runs open-loop producers at each of SteadyRates for
// SteadyDuration, on the relay and on the naive poller.
func (r *runner) steady(ctx context.Context) error {
	for _, rate := range r.cfg.SteadyRates {
		for _, name := range []string{SystemRelay, SystemNaive} {
			r.log.Info("steady: start", "system", name, "rate", rate, "duration", r.cfg.SteadyDuration)
			total := max(1, int(float64(rate)*r.cfg.SteadyDuration.Seconds()))
			res, err := r.produce(ctx, pacing{system: name, producers: r.cfg.Producers, total: total, rate: float64(rate), cost: true})
			if err != nil {
				return err
			}
			res.Workload, res.TargetRate = WorkloadSteady, rate
			r.results = append(r.results, res)
			r.log.Info("steady: done", "system", name, "rate", rate, "committed", res.Committed, "received", res.Events)
		}
		res, err := r.steadyCeiling(ctx, rate)
		if err != nil {
			return err
		}
		r.results = append(r.results, res)
	}
	return nil
}

// steadyCeiling runs the steady workload at rate on the broker ceiling:
// Producers publishers, paced as the producers are, each publish
// confirmed before the next. Its latency is the broker path's alone, the
// floor under the relay's at that rate.
func (r *runner) steadyCeiling(ctx context.Context, rate int) (Result, error) {
	r.log.Info("steady: start", "system", SystemCeiling, "rate", rate, "duration", r.cfg.SteadyDuration)
	total := max(1, int(float64(rate)*r.cfg.SteadyDuration.Seconds()))
	due := func(i int) time.Duration { return time.Duration(float64(i) * float64(time.Second) / float64(rate)) }
	rec, _, elapsed, err := r.ceilingScheduled(ctx, r.cfg.Producers, total, due)
	if err != nil {
		return Result{}, err
	}
	r.log.Info("steady: done", "system", SystemCeiling, "rate", rate, "received", rec.count())
	res := ceilingResult(WorkloadSteady, rec, elapsed)
	res.TargetRate = rate
	return res, nil
}

// pacing describes one paced run.
type pacing struct {
	system    string  // the system under test
	producers int     // connections sharing the rate
	total     int     // events written
	rate      float64 // events per second, over all producers
	cost      bool    // measure the system's CPU and memory
	// aggregates, if not 0, spreads the events over that many aggregates
	// (a multiple of producers), interleaved (see Shape), and checks the
	// order of their first arrivals.
	aggregates int
}

// produce is one paced run: it starts the system, warms it up, has the
// producers write the events at the rate, notes the backlog when they stop
// and waits for the rest (DrainWait for a relay, naiveSettle for the naive
// poller). With cost, it measures the system from the first event to the
// end of the wait.
func (r *runner) produce(ctx context.Context, pc pacing) (res Result, err error) {
	ps, sys, err := r.startProducing(ctx, pc.producers, pc.system)
	if err != nil {
		return Result{}, err
	}
	defer ps.Close()
	defer stopSystem(sys, &err)
	rec := r.newShapedRecord(pc.total, pc.aggregates)
	var meter *costMeter
	if pc.cost {
		if meter, err = beginCost(ctx, r.db, sys); err != nil {
			return Result{}, err
		}
	}
	committed, elapsed, err := ps.paced(ctx, pc.producers, rec, r.clock, pc.rate)
	if err != nil {
		return Result{}, err
	}
	backlog, err := r.db.pending(ctx)
	if err != nil {
		return Result{}, err
	}
	wait := r.cfg.DrainWait
	if pc.system == SystemNaive {
		wait = naiveSettle
	}
	if _, err := r.await(ctx, rec, committed, wait, false, sys); err != nil {
		return Result{}, err
	}
	res = Result{
		System:     pc.system,
		Committed:  committed,
		Events:     rec.count(),
		Seconds:    elapsed.Seconds(),
		Rate:       float64(committed) / elapsed.Seconds(),
		Latency:    rec.latency(),
		Duplicates: rec.duplicates(),
		OutOfOrder: rec.outOfOrder(),
		Backlog:    &backlog,
	}
	if pc.system != SystemNaive {
		res.Lost = ptr(rec.lost())
	}
	if meter != nil {
		res.Cost, err = meter.finish(ctx, rec.count())
	}
	return res, err
}
