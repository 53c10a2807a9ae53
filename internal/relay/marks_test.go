package relay_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/claim"
)

// markDelay is MarkDelay in these tests.
const markDelay = 20 * time.Millisecond

// newMarkingDispatcher is newDispatcher with marks that wait for the next
// claim, as by default.
func newMarkingDispatcher(t *testing.T) *dispatcher {
	d := newDispatcher(t)
	d.cfg.MarkDelay = markDelay
	return d
}

// startAndConfirm starts the relay and waits until its first claim's batch
// is published and its marks wait for the next claim.
func startAndConfirm(t *testing.T, d *dispatcher) {
	t.Helper()
	d.start(t)
	d.store.next(t, "claim")
	d.pub.next(t)
	d.awaitTimer(t, "the wait for a claim to carry the marks", markDelay)
}

// A confirmed batch is not marked on its own: the next claim, woken by the
// next notification, carries its mark.
func TestConfirmedBatchIsMarkedByTheNextClaim(t *testing.T) {
	t.Parallel()
	d := newMarkingDispatcher(t)
	d.store.claim = claims(testBatch(time.Minute, 1, 2), testBatch(time.Minute, 3))
	startAndConfirm(t, d)
	d.store.noMoreCalls(t)

	d.listener.notify(t)
	require.Equal(t, []int64{1, 2}, d.store.next(t, "mark+claim").ids)
	d.pub.next(t)
	d.awaitTimer(t, "the wait for a claim to carry the next marks", markDelay)
	d.store.noMoreCalls(t)
}

// With no claim to carry them, the marks wait MarkDelay and no longer.
func TestMarksWaitAtMostMarkDelay(t *testing.T) {
	t.Parallel()
	d := newMarkingDispatcher(t)
	d.store.claim = claims(testBatch(time.Minute, 1, 2))
	startAndConfirm(t, d)
	d.advanceTo(t, "MarkDelay", markDelay)
	require.Equal(t, []int64{1, 2}, d.store.next(t, "mark").ids)

	// Nothing waits now: no timer for marks, and a claim carries none.
	d.listener.notify(t)
	d.store.next(t, "claim")
	d.store.noMoreCalls(t)
}

// Shutdown marks what waits.
func TestShutdownMarksWhatWaits(t *testing.T) {
	t.Parallel()
	d := newMarkingDispatcher(t)
	d.store.claim = claims(testBatch(time.Minute, 7))
	ctxErr := make(chan error, 1)
	d.store.mark = func(ctx context.Context, ids []int64) (int64, error) {
		ctxErr <- ctx.Err()
		return int64(len(ids)), nil
	}
	startAndConfirm(t, d)
	d.cancel()
	require.Equal(t, []int64{7}, d.store.next(t, "mark").ids)
	require.NoError(t, <-ctxErr, "the shutdown's mark runs under the shutdown deadline, not the cancelled context")
	require.NoError(t, d.returned(t))
}

// A claim that fails took its marks back with it (MarkAndClaim is one
// transaction): the worker marks them on its own before it waits to claim
// again.
func TestMarksOfAFailedClaimAreMadeOnTheirOwn(t *testing.T) {
	t.Parallel()
	d := newMarkingDispatcher(t)
	claimed := false
	d.store.claim = func(context.Context) (claim.Batch, error) {
		if !claimed {
			claimed = true
			return testBatch(time.Minute, 4, 5), nil
		}
		return claim.Batch{}, errors.New("connection reset")
	}
	startAndConfirm(t, d)
	d.listener.notify(t)
	require.Equal(t, []int64{4, 5}, d.store.next(t, "mark+claim").ids)
	require.Equal(t, []int64{4, 5}, d.store.next(t, "mark").ids)
	d.store.noMoreCalls(t)
}

// Marks do not wait for the broker: a worker whose batch left more to
// claim waits for the broker before it claims again, and the marks of
// that batch are made on their own MarkDelay after it was confirmed,
// not held until the broker is back (their lease could lapse first).
func TestMarksDoNotWaitForTheBroker(t *testing.T) {
	t.Parallel()
	d := newMarkingDispatcher(t)
	full := testBatch(time.Minute, 1, 2)
	full.More = true
	d.store.claim = claims(full)
	blocked := make(chan struct{})
	waits := 0
	d.pub.waitReady = func(ctx context.Context) error {
		waits++
		if waits == 1 {
			return nil
		}
		select { // the broker blocks the connection
		case <-blocked:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	startAndConfirm(t, d)
	d.advanceTo(t, "MarkDelay", markDelay)
	require.Equal(t, []int64{1, 2}, d.store.next(t, "mark").ids)
	close(blocked)
	d.store.next(t, "claim") // the worker's claim after the full batch
	d.store.next(t, "claim") // the wake-up the full batch left for another worker
	d.store.noMoreCalls(t)
}
