package bench

import "context"

// scale drains the DrainEvents backlog with each count of ScaleRelays
// relays side by side on the one table, all started together: whether
// more relays deliver faster on this machine, and what they cost together.
func (r *runner) scale(ctx context.Context) error {
	for _, n := range r.cfg.ScaleRelays {
		r.log.Info("scale: start", "relays", n, "events", r.cfg.DrainEvents)
		res, err := r.drainWith(ctx, n)
		if err != nil {
			return err
		}
		r.results = append(r.results, res)
		r.log.Info("scale: done", "relays", n, "rate", round(res.Rate))
	}
	return nil
}

// drainWith drains the backlog with n relays, from their start to the
// last arrival. Its cost is the relays' and their backends' together, per
// 1,000 events delivered; its memory the largest relay's peak.
func (r *runner) drainWith(ctx context.Context, n int) (res Result, err error) {
	rec, err := r.backlog(ctx)
	if err != nil {
		return Result{}, err
	}
	start := r.clock.now()
	systems := make([]*system, 0, n)
	meters := make([]*costMeter, 0, n)
	defer func() {
		for _, sys := range systems {
			stopSystem(sys, &err)
		}
	}()
	for range n {
		sys, meter, err := r.startMetered(ctx, SystemRelay)
		if err != nil {
			return Result{}, err
		}
		systems, meters = append(systems, sys), append(meters, meter)
	}
	if _, err := r.await(ctx, rec, int64(rec.size()), r.cfg.DrainWait, true, systems...); err != nil {
		return Result{}, err
	}
	res = r.drainResult(SystemRelay, rec, start)
	res.Workload, res.Relays = WorkloadScale, n
	res.Lost = ptr(rec.lost())
	costs := make([]*Cost, 0, n)
	for _, m := range meters {
		c, err := m.finish(ctx, rec.count())
		if err != nil {
			return Result{}, err
		}
		costs = append(costs, c)
	}
	res.Cost = sumCosts(costs)
	return res, nil
}

// sumCosts adds the CPU, the claims, the gate's closes and the
// allocations of several relays and their backends, and keeps the largest
// peak memory and the largest WAL per event (each meter saw the whole
// server's WAL, over nearly the same time).
// PostgreSQL's part, the claims, the closes and the allocations are known
// only if every relay's are. Nil if any is nil (nothing delivered).
func sumCosts(costs []*Cost) *Cost {
	sum := &Cost{PGCPUPer1k: ptr(0.0), ClaimsPer1k: ptr(0.0), GateCloses: ptr(0.0), AllocsPerEvent: ptr(0.0)}
	add := func(sum **float64, v *float64) {
		if v == nil || *sum == nil {
			*sum = nil
		} else {
			**sum += *v
		}
	}
	for _, c := range costs {
		if c == nil {
			return nil
		}
		sum.RelayCPUPer1k += c.RelayCPUPer1k
		sum.TotalPer1k += c.TotalPer1k
		sum.PeakRSSMiB = max(sum.PeakRSSMiB, c.PeakRSSMiB)
		sum.WALPerEvent = max(sum.WALPerEvent, c.WALPerEvent)
		add(&sum.PGCPUPer1k, c.PGCPUPer1k)
		add(&sum.ClaimsPer1k, c.ClaimsPer1k)
		add(&sum.GateCloses, c.GateCloses)
		add(&sum.AllocsPerEvent, c.AllocsPerEvent)
	}
	if sum.PGCPUPer1k == nil {
		sum.TotalPer1k = sum.RelayCPUPer1k
	}
	return sum
}
