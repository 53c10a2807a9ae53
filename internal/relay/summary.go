package relay

import (
	"context"
	"sync/atomic"
	"time"
)

// stats counts what the relay did since the last summary.
type stats struct {
	published, failed, dead, released, extended atomic.Int64
}

// summaryInterval is how often the relay logs what it did, if anything.
const summaryInterval = time.Minute

func (r *Relay) summarize(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.cfg.Clock.After(summaryInterval):
			r.logSummary()
		}
	}
}

// logSummary logs at Info what was relayed since the last summary; nothing
// when nothing happened.
func (r *Relay) logSummary() {
	published, failed := r.stats.published.Swap(0), r.stats.failed.Swap(0)
	dead, released := r.stats.dead.Swap(0), r.stats.released.Swap(0)
	extended := r.stats.extended.Swap(0)
	if published+failed+dead+released+extended == 0 {
		return
	}
	r.log.Info("relayed events", "published", published, "retrying", failed, "dead_lettered", dead,
		"released", released, "leases_extended", extended)
}
