package relay

import (
	"context"
	"sync"
	"time"

	"github.com/outboxrelay/outboxrelay/claim"
)

// holdLease renews the batch's lease while the batch is in flight, from
// half-way through each lease, until the returned stop is called. A
// publish or a mark can outlast a lease: a broker that blocks the
// connection for a resource alarm, a slow link, a database mark retried.
// Without renewal the rows would become claimable while this relay may
// still publish them, and be published twice. A failed renewal is retried
// every tenth of a lease; if the lease lapses anyway, a confirmed publish
// is still marked, and the worst case is a duplicate, never a loss.
func (r *Relay) holdLease(ctx context.Context, b claim.Batch, claimed time.Time) (stop func()) {
	if b.LeaseFor <= 0 || len(b.Events) == 0 {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		held := ids(b.Events)
		expires := claimed.Add(b.LeaseFor)
		next := claimed.Add(b.LeaseFor / 2)
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-r.cfg.Clock.After(next.Sub(r.cfg.Clock.Now())):
			}
			start := r.cfg.Clock.Now()
			n, err := r.store.Extend(ctx, b.Lease, held)
			switch {
			case err != nil:
				if ctx.Err() != nil {
					return
				}
				next = r.cfg.Clock.Now().Add(b.LeaseFor / 10)
				r.log.Warn("extend lease failed", "err", err, "events", len(held), "lease_left", expires.Sub(start).Round(time.Millisecond))
				continue
			case n == 0:
				return // every row is settled, or the lease lapsed
			}
			expires = start.Add(b.LeaseFor)
			next = start.Add(b.LeaseFor / 2)
			r.stats.extended.Add(n)
			r.log.Debug("lease extended", "events", n, "lease", b.LeaseFor)
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}
