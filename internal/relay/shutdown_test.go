package relay_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/relay"
	"github.com/outboxrelay/outboxrelay/publish"
)

// These tests stop a relay running on fakes and a fake clock (fakes_test.go)
// while one step of an in-flight batch hangs until its context ends, and
// check that the step is cut at its deadline, not earlier, and that Run then
// returns: after ShutdownTimeout of the fake clock, or ReleaseGrace more for
// a release.

const shutdownTimeout = 20 * time.Second // newDispatcher's

// hangPublish is a Publish that returns only when its context ends.
func hangPublish(ctx context.Context, msgs []publish.Message) []error {
	<-ctx.Done()
	return failAll(len(msgs), ctx.Err())
}

// hang is a store call that returns only when its context ends.
func hang(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}

// beginShutdown cancels Run's context and waits for the shutdown deadline
// to be armed.
func (d *dispatcher) beginShutdown(t *testing.T) {
	t.Helper()
	d.cancel()
	d.awaitTimer(t, "the shutdown deadline", shutdownTimeout)
}

// cutAt advances the clock to by and requires that ctx ends then and not a
// millisecond earlier.
func (d *dispatcher) cutAt(t *testing.T, ctx context.Context, what string, by time.Duration) {
	t.Helper()
	require.Zero(t, d.clock.Advance(by-time.Millisecond), "a timer fell due before %s", what)
	require.NoError(t, ctx.Err(), "cut short before %s", what)
	d.clock.Advance(time.Millisecond)
	select {
	case <-ctx.Done():
	case <-time.After(awaitTimeout):
		t.Fatalf("not cut at %s", what)
	}
}

func TestShutdownIsBoundedWhenAStepHangs(t *testing.T) {
	t.Parallel()
	batch := testBatch(0, 1, 2, 3)

	// The publish is cut at the shutdown deadline and the batch is released
	// unpublished, so the relays that stay can claim it at once.
	t.Run("publish", func(t *testing.T) {
		t.Parallel()
		d := newDispatcher(t)
		d.store.claim = claims(batch)
		d.pub.publish = hangPublish
		d.start(t)
		d.store.next(t, "claim")
		p := d.pub.next(t)
		d.beginShutdown(t)
		d.cutAt(t, p.ctx, "the shutdown deadline", shutdownTimeout)
		c := d.store.next(t, "release")
		require.Equal(t, batch.Lease, c.lease)
		require.Equal(t, []int64{1, 2, 3}, c.ids)
		require.NoError(t, d.returned(t))
		d.store.noMoreCalls(t)
	})

	// A mark retried against a hung database ends at the shutdown deadline,
	// before MarkRetry: the events will be published again, not lost.
	t.Run("mark", func(t *testing.T) {
		t.Parallel()
		d := newDispatcher(t)
		d.store.claim = claims(batch)
		d.store.mark = func(ctx context.Context, _ []int64) (int64, error) { return 0, hang(ctx) }
		d.start(t)
		d.store.next(t, "claim")
		m := d.store.next(t, "mark")
		d.beginShutdown(t)
		d.cutAt(t, m.ctx, "the shutdown deadline", shutdownTimeout)
		require.NoError(t, d.returned(t))
		d.store.noMoreCalls(t)
	})

	// Recording failures that RabbitMQ reported before the deadline ends at
	// the deadline: the events wait for their lease to expire.
	t.Run("retry", func(t *testing.T) {
		t.Parallel()
		d := newDispatcher(t)
		d.store.claim = claims(batch)
		nacked := make(chan struct{})
		d.pub.publish = func(_ context.Context, msgs []publish.Message) []error {
			<-nacked
			return failAll(len(msgs), errors.New("nack"))
		}
		d.store.retry = func(ctx context.Context, _ []claim.Failure) (claim.RetryResult, error) {
			return claim.RetryResult{}, hang(ctx)
		}
		d.start(t)
		d.store.next(t, "claim")
		d.pub.next(t)
		d.beginShutdown(t)
		close(nacked)
		r := d.store.next(t, "retry")
		d.cutAt(t, r.ctx, "the shutdown deadline", shutdownTimeout)
		require.NoError(t, d.returned(t))
		d.store.noMoreCalls(t)
	})

	// The release of a batch the deadline cut short has ReleaseGrace past
	// the deadline, and no more: its rows then wait for their lease.
	t.Run("release", func(t *testing.T) {
		t.Parallel()
		d := newDispatcher(t)
		d.store.claim = claims(batch)
		d.pub.publish = hangPublish
		d.store.release = func(ctx context.Context, _ []int64) (int64, error) { return 0, hang(ctx) }
		d.start(t)
		d.store.next(t, "claim")
		p := d.pub.next(t)
		d.beginShutdown(t)
		d.cutAt(t, p.ctx, "the shutdown deadline", shutdownTimeout)
		c := d.store.next(t, "release")
		require.Equal(t, []int64{1, 2, 3}, c.ids)
		d.awaitTimer(t, "the release's grace", relay.ReleaseGrace)
		d.cutAt(t, c.ctx, "the release's grace", relay.ReleaseGrace)
		require.NoError(t, d.returned(t))
		d.store.noMoreCalls(t)
	})

	// A claim under way when shutdown begins ends at the deadline.
	t.Run("claim", func(t *testing.T) {
		t.Parallel()
		d := newDispatcher(t)
		d.store.claim = func(ctx context.Context) (claim.Batch, error) { return claim.Batch{}, hang(ctx) }
		d.start(t)
		c := d.store.next(t, "claim")
		d.beginShutdown(t)
		d.cutAt(t, c.ctx, "the shutdown deadline", shutdownTimeout)
		require.NoError(t, d.returned(t))
		d.store.noMoreCalls(t)
	})
}

// A batch whose claim returns after shutdown began is released at once,
// unpublished, and Run returns without waiting for any deadline.
func TestBatchClaimedDuringShutdownIsReleased(t *testing.T) {
	t.Parallel()
	d := newDispatcher(t)
	batch := testBatch(0, 1, 2, 3)
	claimed := make(chan struct{})
	d.store.claim = func(context.Context) (claim.Batch, error) {
		<-claimed
		return batch, nil
	}
	d.start(t)
	d.store.next(t, "claim")
	d.beginShutdown(t)
	close(claimed)
	c := d.store.next(t, "release")
	require.Equal(t, batch.Lease, c.lease)
	require.Equal(t, []int64{1, 2, 3}, c.ids)
	require.NoError(t, d.returned(t))
	d.store.noMoreCalls(t)
	require.Empty(t, d.pub.calls, "a batch claimed during shutdown was published")
}
