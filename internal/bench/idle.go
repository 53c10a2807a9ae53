package bench

import (
	"context"
	"time"
)

// idle writes IdleEvents events, one every IdleInterval from one
// connection, on the relay and on the naive poller: the latency of a
// quiet system. The broker ceiling then publishes as many, as often,
// straight to RabbitMQ: the latency of the broker path alone, which the
// relay's adds to.
func (r *runner) idle(ctx context.Context) error {
	for _, name := range []string{SystemRelay, SystemNaive} {
		r.log.Info("idle: start", "system", name, "events", r.cfg.IdleEvents, "interval", r.cfg.IdleInterval)
		res, err := r.produce(ctx, pacing{system: name, producers: 1, total: r.cfg.IdleEvents, rate: float64(time.Second) / float64(r.cfg.IdleInterval)})
		if err != nil {
			return err
		}
		res.Workload, res.IntervalMS = WorkloadIdle, millis(int64(r.cfg.IdleInterval))
		r.results = append(r.results, res)
		r.log.Info("idle: done", "system", name, "received", res.Events)
	}
	res, err := r.idleCeiling(ctx)
	if err != nil {
		return err
	}
	r.results = append(r.results, res)
	r.log.Info("idle: done", "system", SystemCeiling, "received", res.Events)
	return nil
}

// idleCeiling runs the idle workload on the broker ceiling (publishPaced).
func (r *runner) idleCeiling(ctx context.Context) (Result, error) {
	r.log.Info("idle: start", "system", SystemCeiling, "events", r.cfg.IdleEvents, "interval", r.cfg.IdleInterval)
	due := func(i int) time.Duration { return time.Duration(i) * r.cfg.IdleInterval }
	rec, _, elapsed, err := r.ceilingScheduled(ctx, 1, r.cfg.IdleEvents, due)
	if err != nil {
		return Result{}, err
	}
	res := ceilingResult(WorkloadIdle, rec, elapsed)
	res.IntervalMS = millis(int64(r.cfg.IdleInterval))
	return res, nil
}

// ceilingResult is the row of a paced ceiling run of workload: rec's
// events, published over elapsed.
func ceilingResult(workload string, rec *record, elapsed time.Duration) Result {
	return Result{
		Workload:   workload,
		System:     SystemCeiling,
		Committed:  int64(rec.size()),
		Events:     rec.count(),
		Seconds:    elapsed.Seconds(),
		Rate:       float64(rec.size()) / elapsed.Seconds(),
		Latency:    rec.latency(),
		Duplicates: rec.duplicates(),
		Lost:       ptr(rec.lost()),
	}
}

// ceilingScheduled has the broker ceiling publish total events on k
// publishers, slot i at due(i) (publishScheduled), and waits for them to
// arrive. It returns their record, the clock reading of the schedule's
// start and the time the publishers took.
func (r *runner) ceilingScheduled(ctx context.Context, k, total int, due func(i int) time.Duration) (*record, int64, time.Duration, error) {
	if err := r.reset(ctx); err != nil {
		return nil, 0, 0, err
	}
	rec := r.newRecord(total)
	began, err := publishScheduled(ctx, r.cfg.AMQPURL, r.cfg.Exchange, k, rec, r.payloads, r.clock, due)
	if err != nil {
		return nil, 0, 0, err
	}
	elapsed := time.Duration(r.clock.now() - began)
	if _, err := r.await(ctx, rec, int64(rec.size()), r.cfg.DrainWait, true); err != nil {
		return nil, 0, 0, err
	}
	return rec, began, elapsed, nil
}
