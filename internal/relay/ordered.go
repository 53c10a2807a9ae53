package relay

import (
	"cmp"
	"context"
	"errors"
	"slices"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/publish"
)

// errHeldBack is the result of an event of an ordered batch that was not
// published because an earlier event of its aggregate failed, or because
// shutdown came first: the event is given back without counting an
// attempt, and its failed predecessor, now its aggregate's head, holds it
// back in the table.
var errHeldBack = errors.New("held back behind an earlier event of its aggregate")

// errDeadLettered is the result of an event of an ordered batch that was
// dead-lettered mid-batch, under the continue policy, before the next
// event of its aggregate went out: it is settled already.
var errDeadLettered = errors.New("dead-lettered")

// ordered reports whether the batch came from an ordered claim.
func ordered(b claim.Batch) bool {
	return len(b.Events) > 0 && b.Events[0].OrderingKey != ""
}

// publishOrdered publishes an ordered batch and returns one result per
// event, as process expects of a publish. The claim gives each aggregate a
// run of consecutive events; the batch goes out in waves, the first event
// of every run, then the second, and so on, each wave one pipelined
// publish whose confirmations are all awaited before the next. So an event
// is sent only after its predecessor was confirmed, at most one event per
// aggregate is unconfirmed at any moment, and different aggregates share
// every round trip.
//
// A failed event stops its run: the rest of the run is held back
// (errHeldBack), unless the store says recording the failure lets the
// aggregate go on (a dead-lettered event under the continue policy). Such
// an event is dead-lettered at once, before its successor is sent: were the
// record lost, the event would come back as its aggregate's head after its
// successors had gone out.
func (r *Relay) publishOrdered(ctx context.Context, lease claim.LeaseID, events []claim.Event) []error {
	results := make([]error, len(events))
	// runs holds, per aggregate, the indexes of its events not yet sent,
	// in insert order (the batch is sorted by seq).
	var (
		keys []string
		runs = map[string][]int{}
	)
	for i, e := range events {
		if _, ok := runs[e.OrderingKey]; !ok {
			keys = append(keys, e.OrderingKey)
		}
		runs[e.OrderingKey] = append(runs[e.OrderingKey], i)
	}
	holdBack := func(key string) {
		for _, i := range runs[key] {
			results[i] = errHeldBack
		}
		delete(runs, key)
	}
	wave := make([]int, 0, len(keys))
	msgs := make([]publish.Message, 0, len(keys))
	for len(runs) > 0 {
		if ctx.Err() != nil {
			for _, key := range keys {
				holdBack(key)
			}
			break
		}
		wave, msgs = wave[:0], msgs[:0]
		for _, key := range keys {
			run, ok := runs[key]
			if !ok {
				continue
			}
			i := run[0]
			runs[key] = run[1:]
			m, err := r.message(events[i])
			if err != nil {
				results[i] = r.afterFailure(ctx, lease, events[i], err, holdBack)
				continue
			}
			wave = append(wave, i)
			msgs = append(msgs, m)
		}
		if len(msgs) > 0 {
			for k, err := range r.pub.Publish(ctx, msgs) {
				i := wave[k]
				results[i] = err
				if err != nil {
					results[i] = r.afterFailure(ctx, lease, events[i], err, holdBack)
				}
			}
		}
		keys = keys[:0]
		for key, run := range runs {
			if len(run) == 0 {
				delete(runs, key)
				continue
			}
			keys = append(keys, key)
		}
		sortKeysByFirst(keys, runs)
	}
	return results
}

// afterFailure holds back the rest of a failed event's run, unless the
// failure lets its aggregate go on and is recorded now. It returns the
// event's result.
func (r *Relay) afterFailure(ctx context.Context, lease claim.LeaseID, e claim.Event, err error, holdBack func(key string)) error {
	f := claim.Failure{ID: e.ID, Attempts: e.Attempts, Err: err, Permanent: errors.Is(err, publish.ErrInvalid)}
	if ctx.Err() == nil && r.store.Unblocks(f) {
		res, rerr := r.store.Retry(ctx, lease, []claim.Failure{f})
		if rerr == nil && res.Dead == 1 {
			r.stats.dead.Add(1)
			reason := publish.Reason(err)
			r.obs.DeadLettered(reason, 1)
			r.log.Warn("publish failed; dead-lettered, its aggregate goes on", "err", err, "reason", reason, "event", e.ID)
			return errDeadLettered
		}
	}
	holdBack(e.OrderingKey)
	return err
}

// sortKeysByFirst orders the aggregates of the next wave by their next
// event's id, so waves publish in the order the claim took the events.
func sortKeysByFirst(keys []string, runs map[string][]int) {
	slices.SortFunc(keys, func(a, b string) int { return cmp.Compare(runs[a][0], runs[b][0]) })
}
