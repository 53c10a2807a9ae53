package bench

import (
	"context"
	"slices"
)

// producer measures what the outbox costs its producers: each of
// ProducerConcurrency connection counts inserts as fast as it can for
// ProducerDuration. First with the relay running and no ordering index,
// ProducerPairs times with the outbox's insert triggers enabled and then
// disabled; then, with the triggers enabled, ProducerPairs times with the
// ordered relay (keyscan) running and the ordering index it creates, which
// every insert pays for. Each run meters the relay while the producers
// insert: its CPU and its backends' (what delivery took from the
// producers' machine) and the times it closed its gate. The relay drains
// between runs; the index is dropped at the end.
func (r *runner) producer(ctx context.Context) error {
	ps, err := r.db.connectProducers(ctx, slices.Max(r.cfg.ProducerConcurrency), r.payloads)
	if err != nil {
		return err
	}
	defer ps.Close()
	if err := r.db.dropOrderingIndex(ctx); err != nil {
		return err
	}
	if err := r.producerPhase(ctx, ps, SystemRelay, []bool{true, false}); err != nil {
		return err
	}
	if err := r.producerPhase(ctx, ps, SystemKeyscan, []bool{true}); err != nil {
		return err
	}
	return r.db.dropOrderingIndex(ctx)
}

// producerPhase runs every concurrency with each of triggers, with the
// system name running on a table emptied first.
func (r *runner) producerPhase(ctx context.Context, ps *producers, name string, triggers []bool) (err error) {
	sys, err := r.startWarm(ctx, ps, name)
	if err != nil {
		return err
	}
	defer stopSystem(sys, &err)
	index, err := r.checkOrderingIndex(ctx, name)
	if err != nil {
		return err
	}
	r.consumer.track(nil)
	for _, k := range r.cfg.ProducerConcurrency {
		for range r.cfg.ProducerPairs {
			for _, trigger := range triggers {
				r.log.Info("producer: start", "concurrency", k, "trigger", trigger, "ordering_index", index, "duration", r.cfg.ProducerDuration)
				res, err := r.insertRun(ctx, sys, ps, k, trigger)
				if err != nil {
					return err
				}
				res.System, res.OrderingIndex = name, &index
				r.results = append(r.results, res)
				r.log.Info("producer: done", "concurrency", k, "trigger", trigger, "ordering_index", index, "inserts_per_s", round(res.Rate))
			}
		}
	}
	return nil
}

// insertRun is one producer run, its cost per 1,000 rows inserted metered
// while the producers insert. Without the trigger nothing wakes the relay,
// so afterwards one more event is written with the trigger back on; then
// the run waits, up to DrainWait, until nothing is pending.
func (r *runner) insertRun(ctx context.Context, sys *system, ps *producers, k int, trigger bool) (Result, error) {
	meter, err := beginCost(ctx, r.db, sys)
	if err != nil {
		return Result{}, err
	}
	if !trigger {
		if err := r.db.setTriggers(ctx, false); err != nil {
			return Result{}, err
		}
	}
	inserted, elapsed, err := ps.flat(ctx, k, r.cfg.ProducerDuration, &r.ids)
	var cost *Cost
	if err == nil {
		cost, err = meter.finish(ctx, inserted)
	}
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
		Cost:        cost,
	}, nil
}
