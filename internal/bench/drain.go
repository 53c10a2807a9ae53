package bench

import (
	"context"
	"time"
)

// drain delivers a backlog of DrainEvents rows written while nothing runs:
// the relay from its start to the last arrival, the naive poller for
// NaiveDrainTime, and the ceiling from its first publish to the last
// arrival.
func (r *runner) drain(ctx context.Context) error {
	r.log.Info("drain: start", "events", r.cfg.DrainEvents)
	for _, run := range []func(context.Context) (Result, error){r.drainRelay, r.drainNaive, r.drainCeiling} {
		res, err := run(ctx)
		if err != nil {
			return err
		}
		r.results = append(r.results, res)
		r.log.Info("drain: done", "system", res.System, "events", res.Events, "rate", round(res.Rate))
	}
	return nil
}

// backlog resets and writes the backlog with nothing running.
func (r *runner) backlog(ctx context.Context) (*record, error) {
	if err := r.reset(ctx); err != nil {
		return nil, err
	}
	rec := r.newRecord(r.cfg.DrainEvents)
	if err := r.db.insertBacklog(ctx, rec.base, rec.size(), r.payloads); err != nil {
		return nil, err
	}
	rec.commitAll(r.clock.now())
	return rec, nil
}

func (r *runner) drainRelay(ctx context.Context) (res Result, err error) {
	rec, err := r.backlog(ctx)
	if err != nil {
		return Result{}, err
	}
	start := r.clock.now()
	sys, meter, err := r.startMetered(ctx, SystemRelay)
	if err != nil {
		return Result{}, err
	}
	defer stopSystem(sys, &err)
	if _, err := r.await(ctx, rec, int64(rec.size()), r.cfg.DrainWait, true, sys); err != nil {
		return Result{}, err
	}
	res = r.drainResult(SystemRelay, rec, start)
	res.Lost = ptr(rec.lost())
	res.Cost, err = meter.finish(ctx, rec.count())
	return res, err
}

func (r *runner) drainNaive(ctx context.Context) (res Result, err error) {
	rec, err := r.backlog(ctx)
	if err != nil {
		return Result{}, err
	}
	start := time.Now()
	sys, meter, err := r.startMetered(ctx, SystemNaive)
	if err != nil {
		return Result{}, err
	}
	defer stopSystem(sys, &err)
	timer := time.NewTimer(r.cfg.NaiveDrainTime)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-ctx.Done():
		return Result{}, ctx.Err()
	case <-sys.proc.Done():
		return Result{}, sys.proc.exitError()
	case <-r.consumer.Done():
		return Result{}, r.consumer.Err()
	}
	elapsed := time.Since(start)
	res = Result{Workload: WorkloadDrain, System: SystemNaive, Committed: int64(rec.size()), Events: rec.count(),
		Seconds: elapsed.Seconds(), Rate: float64(rec.count()) / elapsed.Seconds(), Duplicates: rec.duplicates()}
	if res.Cost, err = meter.finish(ctx, rec.count()); err != nil {
		return Result{}, err
	}
	if err := sys.proc.stop(); err != nil {
		return Result{}, err
	}
	backlog, err := r.db.pending(ctx)
	res.Backlog = &backlog
	return res, err
}

func (r *runner) drainCeiling(ctx context.Context) (Result, error) {
	if err := r.reset(ctx); err != nil {
		return Result{}, err
	}
	rec := r.newRecord(r.cfg.DrainEvents)
	start, err := publishCeiling(ctx, r.cfg.AMQPURL, r.cfg.Exchange, rec, r.payloads, r.clock)
	if err != nil {
		return Result{}, err
	}
	if _, err := r.await(ctx, rec, int64(rec.size()), r.cfg.DrainWait, true, nil); err != nil {
		return Result{}, err
	}
	res := r.drainResult(SystemCeiling, rec, start)
	res.Lost = ptr(rec.lost())
	return res, nil
}

// drainResult times a drain from start to the last first arrival.
func (r *runner) drainResult(sys string, rec *record, start int64) Result {
	res := Result{Workload: WorkloadDrain, System: sys, Committed: int64(rec.size()), Events: rec.count(), Duplicates: rec.duplicates()}
	if last := rec.lastReceived(); last > start {
		res.Seconds = time.Duration(last - start).Seconds()
		res.Rate = float64(res.Events) / res.Seconds
	}
	return res
}
