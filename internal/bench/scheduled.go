package bench

import (
	"context"
	"time"
)

// scheduledLead is how long after the scheduled workload's write its first
// event falls due: time for the write to commit.
const scheduledLead = 2 * time.Second

// scheduled starts the relay with its fallback poll an hour away, then
// writes ScheduledEvents events in one transaction, due one after another
// over ScheduledOver from scheduledLead on: the relay must wake for each
// at its time. Latency is from an event's time to its first arrival; an
// arrival before its time counts as early.
func (r *runner) scheduled(ctx context.Context) (err error) {
	if err := r.reset(ctx); err != nil {
		return err
	}
	n, over := r.cfg.ScheduledEvents, r.cfg.ScheduledOver
	r.log.Info("scheduled: start", "events", n, "over", over)
	sys, meter, err := r.startMetered(ctx, SystemRelay, "--poll-interval=1h")
	if err != nil {
		return err
	}
	defer stopSystem(sys, &err)
	rec := r.newRecord(n)
	first := time.Now().Add(scheduledLead)
	step := over / time.Duration(n)
	for i := range n {
		rec.commit(i, r.clock.at(first.Add(time.Duration(i)*step)))
	}
	if err := r.db.insertScheduled(ctx, rec.base, n, first, step, r.payloads); err != nil {
		return err
	}
	if _, err := r.await(ctx, rec, int64(n), scheduledLead+over+r.cfg.DrainWait, false, sys); err != nil {
		return err
	}
	res := Result{
		Workload:   WorkloadScheduled,
		System:     SystemRelay,
		Committed:  int64(n),
		Events:     rec.count(),
		Seconds:    over.Seconds(),
		Rate:       float64(rec.count()) / over.Seconds(),
		Latency:    rec.latency(),
		Duplicates: rec.duplicates(),
		Lost:       ptr(rec.lost()),
		Early:      ptr(rec.early()),
	}
	if res.Cost, err = meter.finish(ctx, rec.count()); err != nil {
		return err
	}
	r.results = append(r.results, res)
	r.log.Info("scheduled: done", "events", res.Events, "early", *res.Early)
	return nil
}
