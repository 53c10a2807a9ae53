package bench

import (
	"context"
	"fmt"
)

// orderedSystems are the systems of the ordered workload, in the order it
// runs them: the relay (unordered, the baseline), then the ordered relay.
var orderedSystems = []string{SystemRelay, SystemKeyscan}

// ordered runs the ordered workload. For each of OrderedShapes, a backlog
// written while nothing runs (interleaved by aggregate, see Shape) is
// drained by each of orderedSystems, timed as the drain workload times the
// relay. Then Producers connections write OrderedSteadyRate events per
// second over OrderedSteadyAggregates aggregates for SteadyDuration, on
// each system. The consumer checks the order of first arrivals per
// aggregate on every system. The relay runs without the ordering index,
// the ordered relay with the one it creates; the index is dropped at the
// end.
func (r *runner) ordered(ctx context.Context) error {
	ps, err := r.db.connectProducers(ctx, 1, r.payloads)
	if err != nil {
		return err
	}
	defer ps.Close()
	for _, shape := range r.cfg.OrderedShapes {
		for _, name := range orderedSystems {
			r.log.Info("ordered: start", "shape", shape.String(), "system", name)
			res, err := r.orderedDrain(ctx, ps, shape, name)
			if err != nil {
				return fmt.Errorf("%s, %s: %w", shape, name, err)
			}
			r.results = append(r.results, res)
			r.log.Info("ordered: done", "shape", shape.String(), "system", name, "events", res.Events,
				"rate", round(res.Rate), "out_of_order", *res.OutOfOrder)
		}
	}
	if err := r.orderedSteady(ctx, ps); err != nil {
		return err
	}
	return r.db.dropOrderingIndex(ctx)
}

// orderedDrain delivers one shaped backlog with system name, from the
// system's start to the last first arrival.
func (r *runner) orderedDrain(ctx context.Context, ps *producers, shape Shape, name string) (res Result, err error) {
	if err := r.orderingIndexFor(ctx, ps, name); err != nil {
		return Result{}, err
	}
	if err := r.reset(ctx); err != nil {
		return Result{}, err
	}
	rec := r.newShapedRecord(shape.total(), shape.Aggregates)
	if err := r.db.insertShapedBacklog(ctx, rec.base, shape, r.payloads); err != nil {
		return Result{}, err
	}
	rec.commitAll(r.clock.now())
	start := r.clock.now()
	sys, meter, err := r.startMetered(ctx, name)
	if err != nil {
		return Result{}, err
	}
	defer stopSystem(sys, &err)
	if _, err := r.await(ctx, rec, int64(rec.size()), r.cfg.DrainWait, true, sys); err != nil {
		return Result{}, err
	}
	res = r.drainResult(name, rec, start)
	res.Workload, res.Aggregates, res.PerAggregate = WorkloadOrdered, shape.Aggregates, shape.Events
	res.OutOfOrder = rec.outOfOrder()
	res.Lost = ptr(rec.lost())
	if res.Cost, err = meter.finish(ctx, rec.count()); err != nil {
		return Result{}, err
	}
	if _, err := r.checkOrderingIndex(ctx, name); err != nil {
		return Result{}, err
	}
	return res, nil
}

// orderedSteady runs OrderedSteadyRate over OrderedSteadyAggregates on
// each system, measured as the steady workload measures.
func (r *runner) orderedSteady(ctx context.Context, ps *producers) error {
	rate, aggregates := r.cfg.OrderedSteadyRate, r.cfg.OrderedSteadyAggregates
	total := max(1, int(float64(rate)*r.cfg.SteadyDuration.Seconds()))
	for _, name := range orderedSystems {
		// An ordered relay on an empty table creates the index as it
		// starts, before the warm-up event gets through.
		if name == SystemRelay {
			if err := r.orderingIndexFor(ctx, ps, name); err != nil {
				return err
			}
		}
		r.log.Info("ordered: start", "system", name, "rate", rate, "aggregates", aggregates, "duration", r.cfg.SteadyDuration)
		res, err := r.produce(ctx, pacing{system: name, producers: r.cfg.Producers, total: total, rate: float64(rate), cost: true, aggregates: aggregates})
		if err != nil {
			return fmt.Errorf("steady %d/s, %s: %w", rate, name, err)
		}
		if _, err := r.checkOrderingIndex(ctx, name); err != nil {
			return err
		}
		res.Workload, res.TargetRate, res.Aggregates = WorkloadOrdered, rate, aggregates
		r.results = append(r.results, res)
		r.log.Info("ordered: done", "system", name, "rate", rate, "committed", res.Committed, "received", res.Events,
			"out_of_order", *res.OutOfOrder)
	}
	return nil
}

// orderingIndexFor fits the table to system name: the relay runs without
// the ordering index, so it is dropped; the ordered relay runs with the
// index it creates as it migrates, so, if the index is missing, the
// ordered relay is started on the emptied table, warmed up and stopped.
// No system may be running.
func (r *runner) orderingIndexFor(ctx context.Context, ps *producers, name string) (err error) {
	if name == SystemRelay {
		return r.db.dropOrderingIndex(ctx)
	}
	if has, err := r.db.hasOrderingIndex(ctx); err != nil || has {
		return err
	}
	sys, err := r.startWarm(ctx, ps, name)
	if err != nil {
		return err
	}
	defer stopSystem(sys, &err)
	_, err = r.checkOrderingIndex(ctx, name)
	return err
}

// checkOrderingIndex fails unless the ordering index exists exactly when
// system name is the ordered relay, and reports whether it exists.
func (r *runner) checkOrderingIndex(ctx context.Context, name string) (bool, error) {
	has, err := r.db.hasOrderingIndex(ctx)
	switch {
	case err != nil:
		return false, err
	case has && name == SystemRelay:
		return true, fmt.Errorf("the %s runs with an ordering index, which unordered figures must not pay for", name)
	case !has && name != SystemRelay:
		return false, fmt.Errorf("the ordered relay (%s) runs without an ordering index: it did not create it as it migrated", name)
	}
	return has, nil
}
