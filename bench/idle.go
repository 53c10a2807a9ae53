package bench

import (
	"context"
	"time"
)

// idle writes IdleEvents events, one every IdleInterval from one
// connection, on the relay and on the naive poller: the latency of a
// quiet system.
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
	return nil
}
