package relay_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/publish"
)

// The ordered dispatcher on fakes: which events each publish carries, and
// what the store is told, for one ordered batch.

// orderedBatch is an ordered claim of events with the given ids, each of
// the aggregate its key names.
func orderedBatch(events map[int64]string) claim.Batch {
	ids := make([]int64, 0, len(events))
	for id := range events {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	b := testBatch(time.Minute, ids...)
	for i := range b.Events {
		b.Events[i].OrderingKey = events[b.Events[i].ID]
	}
	return b
}

// waveIDs is the event ids of one publish, by their message ids.
func waveIDs(c publishCall) []string {
	out := make([]string, len(c.msgs))
	for i, m := range c.msgs {
		out[i] = m.MessageID
	}
	return out
}

// Two aggregates, A with events 1, 3, 5 and B with 2 and 4: the batch goes
// out as three publishes, each awaited before the next, carrying at most
// one event of each aggregate, in id order.
func TestOrderedBatchGoesOutOneEventPerAggregateAtATime(t *testing.T) {
	t.Parallel()
	d := newDispatcher(t)
	d.store.claim = claims(orderedBatch(map[int64]string{1: "A", 3: "A", 5: "A", 2: "B", 4: "B"}))
	d.start(t)
	d.store.next(t, "claim")
	require.Equal(t, []string{"event-1", "event-2"}, waveIDs(d.pub.next(t)))
	require.Equal(t, []string{"event-3", "event-4"}, waveIDs(d.pub.next(t)))
	require.Equal(t, []string{"event-5"}, waveIDs(d.pub.next(t)))
	require.ElementsMatch(t, []int64{1, 2, 3, 4, 5}, d.store.next(t, "mark").ids)
}

// A's head is nacked: A's later events are never published, and are given
// back (released, not retried: they made no attempt); the head goes back
// on the retry schedule; B goes on.
func TestOrderedFailedHeadHoldsBackOnlyItsAggregate(t *testing.T) {
	t.Parallel()
	d := newDispatcher(t)
	d.store.claim = claims(orderedBatch(map[int64]string{1: "A", 3: "A", 5: "A", 2: "B", 4: "B"}))
	d.pub.publish = func(_ context.Context, msgs []publish.Message) []error {
		errs := make([]error, len(msgs))
		for i, m := range msgs {
			if m.MessageID == "event-1" {
				errs[i] = publish.ErrNacked
			}
		}
		return errs
	}
	d.start(t)
	d.store.next(t, "claim")
	require.Equal(t, []string{"event-1", "event-2"}, waveIDs(d.pub.next(t)))
	require.Equal(t, []string{"event-4"}, waveIDs(d.pub.next(t)))
	require.Equal(t, []int64{2, 4}, d.store.next(t, "mark").ids)
	require.Equal(t, []int64{1}, d.store.next(t, "retry").ids)
	require.Equal(t, []int64{3, 5}, d.store.next(t, "release").ids)
}

// Under the continue policy a head that is dead-lettered lets its
// aggregate go on, but only once its dead-lettering is recorded: the
// store hears of it before the next event of the aggregate is published.
func TestOrderedDeadHeadUnderContinueIsRecordedBeforeItsSuccessorGoes(t *testing.T) {
	t.Parallel()
	d := newDispatcher(t)
	d.store.claim = claims(orderedBatch(map[int64]string{1: "A", 2: "A"}))
	d.store.unblocks = func(f claim.Failure) bool { return f.ID == 1 && f.Permanent }
	d.store.retry = func(context.Context, []claim.Failure) (claim.RetryResult, error) {
		return claim.RetryResult{Dead: 1}, nil
	}
	d.pub.publish = func(_ context.Context, msgs []publish.Message) []error {
		if msgs[0].MessageID == "event-1" {
			return failAll(1, errors.Join(publish.ErrInvalid, errors.New("too big")))
		}
		return make([]error, len(msgs))
	}
	d.start(t)
	d.store.next(t, "claim")
	require.Equal(t, []string{"event-1"}, waveIDs(d.pub.next(t)))
	require.Equal(t, []int64{1}, d.store.next(t, "retry").ids, "dead-lettered before event 2 goes")
	require.Equal(t, []string{"event-2"}, waveIDs(d.pub.next(t)))
	require.Equal(t, []int64{2}, d.store.next(t, "mark").ids)
}

// An event written while its aggregate's head was in flight found the
// aggregate blocked; once the head's batch is settled, the worker claims
// again at once, without a notification or the fallback poll (an hour
// away here).
func TestOrderedBatchSettledIsFollowedByAnotherClaim(t *testing.T) {
	t.Parallel()
	d := newDispatcher(t)
	d.store.claim = claims(orderedBatch(map[int64]string{1: "A"}), orderedBatch(map[int64]string{2: "A"}))
	d.start(t)
	d.store.next(t, "claim")
	require.Equal(t, []string{"event-1"}, waveIDs(d.pub.next(t)))
	require.Equal(t, []int64{1}, d.store.next(t, "mark").ids)
	d.store.next(t, "claim")
	require.Equal(t, []string{"event-2"}, waveIDs(d.pub.next(t)))
	require.Equal(t, []int64{2}, d.store.next(t, "mark").ids)
	d.store.next(t, "claim") // empty: the pass ends
}
