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
//
// A batch costs one timer and nothing else until its first renewal falls
// due, which almost no batch lives to see: the renewal runs in the timer's
// own goroutine and arms the next.
func (r *Relay) holdLease(ctx context.Context, b claim.Batch, claimed time.Time) (stop func()) {
	if b.LeaseFor <= 0 || len(b.Events) == 0 {
		return func() {}
	}
	h := &leaseHold{r: r, ctx: ctx, b: b, expires: claimed.Add(b.LeaseFor)}
	h.arm(claimed.Add(b.LeaseFor / 2))
	return h.stop
}

// leaseHold renews one batch's lease.
type leaseHold struct {
	r       *Relay
	ctx     context.Context
	b       claim.Batch
	expires time.Time // when the lease lapses unless renewed
	held    []int64   // the batch's ids, from the first renewal on

	mu      sync.Mutex
	stopped bool
	cancel  func() bool // stops the armed timer
	// pending counts the armed timer and the renewal running, so that stop
	// can wait for a renewal under way.
	pending sync.WaitGroup
}

// arm schedules the next renewal at next, unless the hold has stopped. The
// timer is made outside the lock: a clock may run a due f at once.
func (h *leaseHold) arm(next time.Time) {
	h.mu.Lock()
	if h.stopped || h.ctx.Err() != nil {
		h.mu.Unlock()
		return
	}
	h.pending.Add(1)
	h.mu.Unlock()
	cancel := h.r.cfg.Clock.AfterFunc(next.Sub(h.r.cfg.Clock.Now()), h.renew)
	h.mu.Lock()
	h.cancel = cancel
	stopped := h.stopped
	h.mu.Unlock()
	if stopped && cancel() {
		h.pending.Done() // stop came first and could not cancel this timer
	}
}

// renew extends the lease once and arms the next renewal: half a lease on
// after a renewal that held rows, a tenth of a lease after a failure, none
// once no row is left to hold.
func (h *leaseHold) renew() {
	defer h.pending.Done()
	r, b := h.r, h.b
	if h.ctx.Err() != nil {
		return
	}
	if h.held == nil {
		h.held = ids(b.Events)
	}
	start := r.cfg.Clock.Now()
	n, err := r.store.Extend(h.ctx, b.Lease, h.held)
	switch {
	case err != nil:
		if h.ctx.Err() != nil {
			return
		}
		r.log.Warn("extend lease failed", "err", err, "events", len(h.held), "lease_left", h.expires.Sub(start).Round(time.Millisecond))
		h.arm(r.cfg.Clock.Now().Add(b.LeaseFor / 10))
		return
	case n == 0:
		return // every row is settled, or the lease lapsed
	}
	h.expires = start.Add(b.LeaseFor)
	r.stats.extended.Add(n)
	r.log.Debug("lease extended", "events", n, "lease", b.LeaseFor)
	h.arm(start.Add(b.LeaseFor / 2))
}

// stop ends the renewals and waits for one under way.
func (h *leaseHold) stop() {
	h.mu.Lock()
	h.stopped = true
	if h.cancel != nil && h.cancel() {
		h.pending.Done() // the armed timer will not fire
	}
	h.mu.Unlock()
	h.pending.Wait()
}
