package relay

import (
	"context"
	"sync"
	"time"
)

// confirmed is a batch's events that the broker confirmed, waiting to be
// marked published.
type confirmed struct {
	ids  []int64
	lags []time.Duration // from each event's creation to its confirmation
	took time.Duration   // the batch's publish, for the observer
}

// markQueue holds confirmed events whose mark waits for the next claim to
// carry it (Config.MarkDelay): Store.MarkAndClaim sends the mark of one
// batch and the claim of the next in one round trip and one commit, where
// marking each batch on its own costs a round trip and a commit more. At
// everyday rates a claim follows within a millisecond or two, woken by the
// next event's notification; a worker that waits longer than MarkDelay
// marks the queue on its own (flushMarks).
type markQueue struct {
	mu      sync.Mutex
	batches []confirmed
}

func (q *markQueue) add(c confirmed) {
	q.mu.Lock()
	q.batches = append(q.batches, c)
	q.mu.Unlock()
}

// take empties the queue and returns what it held.
func (q *markQueue) take() []confirmed {
	q.mu.Lock()
	defer q.mu.Unlock()
	taken := q.batches
	q.batches = nil
	return taken
}

// waiting reports whether any events wait for their mark.
func (q *markQueue) waiting() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.batches) > 0
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
	r.marks.add(c)
}

// marked tells the observer of batches whose mark went through.
func (r *Relay) marked(batches []confirmed) {
	for _, b := range batches {
		r.obs.Published(b.lags, b.took)
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

// flushMarks marks whatever the queue holds: when a worker has waited
// MarkDelay for a claim to carry it, and once at shutdown.
func (r *Relay) flushMarks(drainCtx context.Context) {
	r.settle(drainCtx, r.marks.take())
}

// markTimer is a worker's wait for MarkDelay while marks are queued: its
// channel is nil when nothing is queued, so a select on it waits for
// nothing.
func (r *Relay) markTimer(t *clockTimer) <-chan time.Time {
	if r.cfg.MarkDelay < 0 || !r.marks.waiting() {
		t.Stop()
		return nil
	}
	t.Start(r.cfg.MarkDelay)
	return t.C()
}
