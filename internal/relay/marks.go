package relay

import (
	"context"
	"slices"
	"sync"
	"time"
)

// confirmed is a batch's events that the broker confirmed, waiting to be
// marked published.
type confirmed struct {
	ids  []int64
	lags []time.Duration // from each event's creation to its confirmation
	took time.Duration   // the batch's publish, for the observer
	at   time.Time       // when it was confirmed, and queued
}

// markQueue holds confirmed events whose mark waits for the next claim to
// carry it (Config.MarkDelay): Store.MarkAndClaim sends the mark of one
// batch and the claim of the next in one round trip and one commit, where
// marking each batch on its own costs a round trip and a commit more. At
// everyday rates a claim follows within a millisecond or two, woken by the
// next event's notification or the busy poll; the mark loop marks what has
// waited MarkDelay with no claim to carry it.
type markQueue struct {
	mu      sync.Mutex
	batches []confirmed // oldest first
	// armed is set while the mark loop has its timer set for the oldest
	// batch; add kicks the loop only when it is not, so a queue that
	// claims keep emptying costs the loop one wake-up per MarkDelay at
	// most, not one per batch.
	armed bool
	kick  chan struct{}
}

// add queues c and reports whether the mark loop must be kicked.
func (q *markQueue) add(c confirmed) (kick bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.batches = append(q.batches, c)
	kick = !q.armed
	q.armed = true
	return kick
}

// putBack queues batches again ahead of the rest (they are older), and
// reports whether the mark loop must be kicked.
func (q *markQueue) putBack(batches []confirmed) (kick bool) {
	if len(batches) == 0 {
		return false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.batches = append(slices.Clone(batches), q.batches...)
	kick = !q.armed
	q.armed = true
	return kick
}

// take empties the queue and returns what it held.
func (q *markQueue) take() []confirmed {
	q.mu.Lock()
	defer q.mu.Unlock()
	taken := q.batches
	q.batches = nil
	return taken
}

// due takes the batches queued at or before by, and returns when the
// oldest one left falls due (zero, and the loop disarmed, if none is left).
func (q *markQueue) due(by time.Time, delay time.Duration) ([]confirmed, time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for n < len(q.batches) && !q.batches[n].at.After(by) {
		n++
	}
	taken := slices.Clone(q.batches[:n])
	q.batches = slices.Delete(q.batches, 0, n)
	if len(q.batches) == 0 {
		q.armed = false
		return taken, time.Time{}
	}
	return taken, q.batches[0].at.Add(delay)
}

// markIDs is every id of batches, in one slice.
func markIDs(batches []confirmed) []int64 {
	if len(batches) == 1 {
		return batches[0].ids
	}
	n := 0
	for _, b := range batches {
		n += len(b.ids)
	}
	out := make([]int64, 0, n)
	for _, b := range batches {
		out = append(out, b.ids...)
	}
	return out
}

// confirm records a batch's confirmed events: their mark is queued for the
// next claim, or, with MarkDelay negative, made now.
func (r *Relay) confirm(drainCtx context.Context, c confirmed) {
	if len(c.ids) == 0 {
		return
	}
	r.stats.published.Add(int64(len(c.ids)))
	if r.cfg.MarkDelay < 0 {
		r.settle(drainCtx, []confirmed{c})
		return
	}
	if r.marks.add(c) {
		select {
		case r.marks.kick <- struct{}{}:
		default:
		}
	}
}

// marked tells the observer of batches whose mark went through, and wakes
// an idle advance loop: the floor may rise past them now. (Not at their
// claim: until their marks their rows hold the floor, and an advance then
// would only compete with their publishing for the CPUs.)
func (r *Relay) marked(batches []confirmed) {
	for _, b := range batches {
		r.obs.Published(b.lags, b.took)
	}
	if len(batches) > 0 {
		r.kickAdvance()
	}
}

// settle marks batches on their own, retrying a failing database (see
// markPublished).
func (r *Relay) settle(drainCtx context.Context, batches []confirmed) {
	if len(batches) == 0 {
		return
	}
	if r.markPublished(drainCtx, markIDs(batches)) {
		r.marked(batches)
	}
}

// markLoop marks what has waited MarkDelay in the queue with no claim to
// carry it: the workers may all be idle, or waiting for the broker, which
// must not hold marks until their lease lapses. Shutdown marks the rest
// (Run).
func (r *Relay) markLoop(ctx, drainCtx context.Context) {
	timer := clockTimer{clock: r.cfg.Clock}
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.marks.kick:
		case <-timer.C():
		}
		now := r.cfg.Clock.Now()
		batches, next := r.marks.due(now.Add(-r.cfg.MarkDelay), r.cfg.MarkDelay)
		r.settle(drainCtx, batches)
		if next.IsZero() {
			timer.Stop()
		} else {
			timer.Start(next.Sub(r.cfg.Clock.Now()))
		}
	}
}
