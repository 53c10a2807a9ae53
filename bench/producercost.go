package bench

import (
	"context"
	"slices"
)

// producer measures what the outbox costs its producers: with the relay
// running, each of ProducerConcurrency connection counts inserts as fast as
// it can for ProducerDuration, once with the outbox's insert triggers
// enabled and once with them disabled. The relay drains between runs.
func (r *runner) producer(ctx context.Context) (err error) {
	if err := r.reset(ctx); err != nil {
		return err
	}
	ps, err := r.db.connectProducers(ctx, slices.Max(r.cfg.ProducerConcurrency), r.payloads)
	if err != nil {
		return err
	}
	defer ps.Close()
	sys, err := r.start(SystemRelay)
	if err != nil {
		return err
	}
	defer stopSystem(sys, &err)
	if err := r.warmUp(ctx, sys, ps); err != nil {
		return err
	}
	r.consumer.track(nil)
	for _, k := range r.cfg.ProducerConcurrency {
		for _, trigger := range []bool{true, false} {
			r.log.Info("producer: start", "concurrency", k, "trigger", trigger, "duration", r.cfg.ProducerDuration)
			res, err := r.insertRun(ctx, sys, ps, k, trigger)
			if err != nil {
				return err
			}
			r.results = append(r.results, res)
			r.log.Info("producer: done", "concurrency", k, "trigger", trigger, "inserts_per_s", round(res.Rate))
		}
	}
	return nil
}

// insertRun is one producer run. Without the trigger nothing wakes the
// relay, so afterwards one more event is written with the trigger back on;
// then the run waits, up to DrainWait, until nothing is pending.
func (r *runner) insertRun(ctx context.Context, sys *system, ps *producers, k int, trigger bool) (Result, error) {
	if !trigger {
		if err := r.db.setTriggers(ctx, false); err != nil {
			return Result{}, err
		}
	}
	inserted, elapsed, err := ps.flat(ctx, k, r.cfg.ProducerDuration, &r.ids)
	if !trigger {
		if terr := r.db.setTriggers(context.WithoutCancel(ctx), true); err == nil {
			err = terr
		}
	}
	if err != nil {
		return Result{}, err
	}
	if !trigger {
		if err := ps.insert(ctx, ps.conns[0], r.ids.Add(1)-1); err != nil {
			return Result{}, err
		}
	}
	drained, err := r.awaitPending(ctx, r.cfg.DrainWait, sys)
	if err != nil {
		return Result{}, err
	}
	if !drained {
		r.log.Warn("producer: the relay did not drain between runs", "wait", r.cfg.DrainWait)
	}
	return Result{
		Workload:    WorkloadProducer,
		System:      SystemRelay,
		Concurrency: k,
		Trigger:     &trigger,
		Committed:   inserted,
		Events:      inserted,
		Seconds:     elapsed.Seconds(),
		Rate:        float64(inserted) / elapsed.Seconds(),
	}, nil
}
