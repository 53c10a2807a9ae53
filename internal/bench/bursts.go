package bench

import (
	"context"
	"time"
)

// fullSpeed is a pace no producer keeps up with: every slot is due at once,
// so each connection inserts as fast as it can.
const fullSpeed = 1e12

// burstSlots is how many events a burst's record has room for, per second
// of BurstDuration: more than a machine's producers commit one event per
// transaction.
const burstSlots = 50_000

// The bursts workload's arms. With the triggers, the relay as it runs.
// Without them, two baselines: the same relay, which finds the rows only
// at its next reading of the insert sequence (up to 2 s into the burst,
// so it rests through the burst's first second), and a relay that polls
// every busy poll interval without LISTEN (a poller: no trigger, no gate),
// delivering from the burst's first claim, as a busy relay does.
const (
	BurstTriggered = "triggered"
	BurstResting   = "resting"
	BurstPolling   = "polling"
)

// bursts measures load that arrives after a quiet spell, as it does in
// production: BurstPairs times, a burst with the outbox's triggers enabled
// and then one for each baseline without them, each after the relay has
// rested for BurstRest with nothing inserted, BurstProducers connections
// inserting as fast as they can for BurstDuration. Each burst reports the
// producers' rate over the whole burst and over its first second (where
// the relay's gate has yet to see the burst), and, with the triggers, the
// latency from commit to consumer and the relay's CPU per event, burst and
// drain.
func (r *runner) bursts(ctx context.Context) error {
	ps, err := r.db.connectProducers(ctx, r.cfg.BurstProducers, r.payloads)
	if err != nil {
		return err
	}
	defer ps.Close()
	for i := range r.cfg.BurstPairs {
		for _, arm := range []string{BurstTriggered, BurstResting, BurstPolling} {
			r.log.Info("bursts: start", "burst", i+1, "arm", arm, "rest", r.cfg.BurstRest, "duration", r.cfg.BurstDuration)
			res, err := r.burstArm(ctx, ps, arm)
			if err != nil {
				return err
			}
			res.Burst = i + 1
			r.results = append(r.results, res)
			r.log.Info("bursts: done", "burst", i+1, "arm", arm, "inserts_per_s", round(res.Rate),
				"first_second_per_s", round(*res.FirstSecondRate))
		}
	}
	return nil
}

// burstArm starts the relay of arm, warmed up, runs one burst and stops
// the relay.
func (r *runner) burstArm(ctx context.Context, ps *producers, arm string) (res Result, err error) {
	var args []string
	if arm == BurstPolling {
		args = []string{"--no-listen", "--poll-interval=" + r.cfg.busyPoll().String()}
	}
	sys, err := r.startWarm(ctx, ps, SystemRelay, args...)
	if err != nil {
		return Result{}, err
	}
	defer stopSystem(sys, &err)
	res, err = r.burst(ctx, sys, ps, arm == BurstTriggered)
	res.BurstArm = arm
	return res, err
}

// burst is one burst after a rest; the relay drains it before it returns.
// Without the triggers nothing notifies the relay, which finds the rows by
// polling or through its reading of the insert sequence; their latency is
// not reported.
func (r *runner) burst(ctx context.Context, sys *system, ps *producers, trigger bool) (Result, error) {
	if !trigger {
		if err := r.db.setTriggers(ctx, false); err != nil {
			return Result{}, err
		}
	}
	rest := time.NewTimer(r.cfg.BurstRest)
	select {
	case <-rest.C:
	case <-ctx.Done():
		rest.Stop()
		return Result{}, ctx.Err()
	}
	meter, err := beginCost(ctx, r.db, sys)
	if err != nil {
		return Result{}, err
	}
	rec := r.newRecord(int(burstSlots*r.cfg.BurstDuration.Seconds()) + ps.size())
	stop := make(chan struct{})
	end := time.AfterFunc(r.cfg.BurstDuration, func() { close(stop) })
	defer end.Stop()
	began := r.clock.now()
	committed, elapsed, err := ps.pacedUntil(ctx, ps.size(), rec, r.clock, fullSpeed, stop)
	if !trigger {
		if terr := r.db.setTriggers(context.WithoutCancel(ctx), true); err == nil {
			err = terr
		}
	}
	if err != nil {
		return Result{}, err
	}
	if _, err := r.await(ctx, rec, committed, r.cfg.DrainWait, true, sys); err != nil {
		return Result{}, err
	}
	cost, err := meter.finish(ctx, committed)
	if err != nil {
		return Result{}, err
	}
	first := span{from: began, to: began + int64(time.Second)}
	seconds := min(elapsed, time.Second).Seconds()
	res := Result{
		Workload:        WorkloadBursts,
		System:          SystemRelay,
		Concurrency:     ps.size(),
		Trigger:         &trigger,
		Committed:       committed,
		Events:          rec.count(),
		Seconds:         elapsed.Seconds(),
		Rate:            float64(committed) / elapsed.Seconds(),
		FirstSecondRate: ptr(float64(rec.committedIn(first)) / seconds),
		Lost:            ptr(rec.lost()),
		Duplicates:      rec.duplicates(),
		Cost:            cost,
	}
	if trigger {
		res.Latency = rec.latency()
	}
	return res, nil
}
