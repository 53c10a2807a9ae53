package bench

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// The early-ids workload's producers and id cache: four sessions, each
// taking its ids from the id sequence in blocks of 50 (a sequence with
// CACHE 50, as an ORM's pooled optimizer hands them out), so that every
// session commits ids below those the others took since.
const (
	earlyIDsProducers = 4
	earlyIDsCache     = 50
)

// earlyIDs runs open-loop producers at EarlyIDsRate for EarlyIDsDuration,
// with the id sequence's cache at earlyIDsCache, against the relay with
// its defaults. Latency is commit → consumer; an event that has not
// arrived within DrainWait is lost. The relay's claims follow relay_seq,
// which the insert draws, so the ids' order must not matter.
func (r *runner) earlyIDs(ctx context.Context) (err error) {
	if err := r.reset(ctx); err != nil {
		return err
	}
	seq := pgx.Identifier{r.db.schema, "outbox_id_seq"}.Sanitize()
	if err := r.db.exec(ctx, "cache the id sequence", fmt.Sprintf("ALTER SEQUENCE %s CACHE %d", seq, earlyIDsCache)); err != nil {
		return err
	}
	defer func() {
		if rerr := r.db.exec(context.WithoutCancel(ctx), "uncache the id sequence", "ALTER SEQUENCE "+seq+" CACHE 1"); err == nil {
			err = rerr
		}
	}()
	rate := r.cfg.EarlyIDsRate
	total := max(1, int(float64(rate)*r.cfg.EarlyIDsDuration.Seconds()))
	r.log.Info("early-ids: start", "rate", rate, "duration", r.cfg.EarlyIDsDuration, "producers", earlyIDsProducers, "cache", earlyIDsCache)
	res, err := r.produce(ctx, pacing{system: SystemRelay, producers: earlyIDsProducers, total: total, rate: float64(rate), cost: true})
	if err != nil {
		return err
	}
	res.Workload, res.TargetRate = WorkloadEarlyIDs, rate
	r.results = append(r.results, res)
	r.log.Info("early-ids: done", "committed", res.Committed, "received", res.Events, "lost", *res.Lost)
	return nil
}
