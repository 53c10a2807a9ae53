package relay_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/publish"
)

// These tests run the dispatcher on fakes (fakes_test.go) and a fake clock
// that moves only when the test advances it, so every timed decision of the
// relay is checked to the millisecond, and in milliseconds of real time.

// A batch in flight has its lease renewed half-way through each lease; a
// failed renewal is tried again a tenth of a lease later; renewal stops
// once Extend finds no row left to hold.
func TestLeaseIsRenewedWhileTheBatchIsInFlight(t *testing.T) {
	t.Parallel()
	d := newDispatcher(t)
	const lease = 10 * time.Second
	batch := testBatch(lease, 1, 2, 3)
	d.store.claim = claims(batch)
	extends := []struct {
		n   int64
		err error
	}{{0, errors.New("connection reset")}, {3, nil}, {0, nil}}
	d.store.extend = func(context.Context, []int64) (int64, error) {
		e := extends[0]
		extends = extends[1:]
		return e.n, e.err
	}
	published := make(chan []error)
	d.pub.publish = func(ctx context.Context, msgs []publish.Message) []error { return <-published }
	d.start(t)
	d.store.next(t, "claim")
	d.pub.next(t)

	// The claim's lease runs from before the claim: renewal is due at half
	// of it from there.
	d.awaitTimer(t, "the first renewal", lease/2)
	d.advanceTo(t, "half the lease", lease/2)
	c := d.store.next(t, "extend")
	require.Equal(t, batch.Lease, c.lease)
	require.Equal(t, []int64{1, 2, 3}, c.ids)

	// That renewal failed: the next comes a tenth of a lease later.
	d.awaitTimer(t, "the renewal after a failure", lease/10)
	d.advanceTo(t, "a tenth of the lease", lease/10)
	d.store.next(t, "extend")

	// That one held every row: the next is half a lease after it began.
	d.awaitTimer(t, "the renewal after a success", lease/2)
	d.advanceTo(t, "half the renewed lease", lease/2)
	d.store.next(t, "extend")

	// That one found no row left: renewal stops, and the batch settles.
	published <- make([]error, 3) // every event confirmed
	d.store.next(t, "mark")
	// A claim after the batch means process, and its lease keeper with it,
	// has returned: a keeper that went on would have left its next timer.
	d.listener.notify(t)
	d.store.next(t, "claim")
	for _, left := range d.clock.Pending() {
		require.Greater(t, left, lease, "a lease timer outlived the renewal that found no rows")
	}
	d.store.noMoreCalls(t)
}

// A failed publish puts its events back on the store's retry schedule, and
// the relay wakes itself when each retry falls due: not before, when the
// claim would not see the row yet, and not only at the fallback poll an
// hour later. Retries due within a few milliseconds of each other share a
// wake-up, at the latest of them.
func TestFailedPublishWakesTheRelayWhenItsRetryIsDue(t *testing.T) {
	t.Parallel()
	const s = time.Second
	for _, tc := range []struct {
		name  string
		due   []time.Duration // the store's retry delays, one per event
		wakes []time.Duration // the wake-ups expected, from the failure
	}{
		{"one retry", []time.Duration{3 * s}, []time.Duration{3 * s}},
		{"two retries 2ms apart", []time.Duration{3 * s, 3*s + 2*time.Millisecond}, []time.Duration{3*s + 2*time.Millisecond}},
		{"two retries 2ms apart, later first", []time.Duration{3*s + 2*time.Millisecond, 3 * s}, []time.Duration{3*s + 2*time.Millisecond}},
		{"two retries 2s apart", []time.Duration{3 * s, 1 * s}, []time.Duration{1 * s, 3 * s}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := newDispatcher(t)
			ids := make([]int64, len(tc.due))
			for i := range ids {
				ids[i] = int64(i + 1)
			}
			d.store.claim = claims(testBatch(0, ids...))
			d.pub.publish = func(_ context.Context, msgs []publish.Message) []error {
				return failAll(len(msgs), errors.New("nack"))
			}
			d.store.retry = func(context.Context, []claim.Failure) (claim.RetryResult, error) {
				return claim.RetryResult{Due: tc.due}, nil
			}
			d.start(t)
			d.store.next(t, "claim")
			require.Equal(t, ids, d.store.next(t, "retry").ids)

			var elapsed time.Duration
			for _, at := range tc.wakes {
				what := fmt.Sprintf("the retry due at %s", at)
				d.awaitTimer(t, what, at-elapsed)
				d.advanceTo(t, what, at-elapsed)
				elapsed = at
				d.store.next(t, "claim")
			}
			d.store.noMoreCalls(t)
		})
	}
}

// A failing claim is tried again after a delay that grows from 100ms by
// half each time (±50% jitter), and a claim that succeeds resets it.
func TestFailingClaimIsRetriedWithGrowingDelays(t *testing.T) {
	t.Parallel()
	d := newDispatcher(t)
	const failures = 6
	n := 0
	d.store.claim = func(context.Context) (claim.Batch, error) {
		n++
		if n == failures+1 {
			return claim.Batch{}, nil
		}
		return claim.Batch{}, errors.New("database is restarting")
	}
	d.start(t)

	// Only the claim's retry timer is due within a minute.
	retryTimer := func(left time.Duration) bool { return left < 30*time.Second }
	expect := func(k int) (low, high time.Duration) {
		base := float64(100 * time.Millisecond)
		for range k {
			base *= 1.5
		}
		return time.Duration(0.5*base) - time.Millisecond, time.Duration(1.5*base) + time.Millisecond
	}
	for k := range failures {
		d.store.next(t, "claim")
		delay := d.clock.AwaitTimer(t, awaitTimeout, "the claim's retry", retryTimer)
		low, high := expect(k)
		require.True(t, low <= delay && delay <= high, "retry %d after %s, want %s to %s", k+1, delay, low, high)
		d.advanceTo(t, "the claim's retry", delay)
	}
	d.store.next(t, "claim") // it succeeds, and finds nothing

	// The next failure starts again from 100ms.
	d.listener.notify(t)
	d.store.next(t, "claim")
	delay := d.clock.AwaitTimer(t, awaitTimeout, "the claim's retry after a success", retryTimer)
	low, high := expect(0)
	require.True(t, low <= delay && delay <= high, "retry after a success after %s, want %s to %s", delay, low, high)
}

// Notifications read together are each handed to a waiting worker; a
// wake-up that the listener counted before a claim was sent is covered by
// that claim and claims nothing more, while one counted after it claims.
func TestAWakeUpCoveredByAClaimSentAfterItClaimsNothing(t *testing.T) {
	t.Parallel()
	d := newDispatcher(t)
	seen := make(chan uint64, 10) // the listener's Signals at each claim
	d.store.claim = func(context.Context) (claim.Batch, error) {
		seen <- d.listener.Signals()
		return claim.Batch{}, nil
	}
	claimed := func(want uint64, what string) {
		t.Helper()
		select {
		case got := <-seen:
			require.Equal(t, want, got, "the claim after %s", what)
		case <-time.After(awaitTimeout):
			t.Fatalf("no claim after %s within %s", what, awaitTimeout)
		}
	}
	d.start(t)
	claimed(0, "the start")

	// Two notifications arrive in one read: both are counted, then each is
	// handed to a worker. The first one's claim covers both.
	d.listener.signals.Add(2)
	d.listener.handOff(t)
	claimed(2, "the first of two notifications")
	d.listener.handOff(t) // the second: covered
	// The only worker takes this one once it is done with the second, so
	// a claim for the second would have read Signals before the
	// notification below.
	d.listener.handOff(t)

	// A notification after that claim was sent needs a claim of its own.
	d.listener.notify(t)
	claimed(3, "a later notification")
}

// reasonObserver is a relay.Observer that records the failures it is told
// of, by reason.
type reasonObserver struct {
	mu            sync.Mutex
	retried, dead map[string]int
}

func (o *reasonObserver) Claimed(int, time.Duration)               {}
func (o *reasonObserver) Published([]time.Duration, time.Duration) {}
func (o *reasonObserver) Released(int)                             {}
func (o *reasonObserver) GateClosed(bool)                          {}
func (o *reasonObserver) Retried(reason string, n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.retried[reason] += n
}
func (o *reasonObserver) DeadLettered(reason string, n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.dead[reason] += n
}

// A failed publish is counted for the metrics and logged under one word,
// publish.Reason's, the word the PRODUCER span's error.type carries too: a
// missing exchange is missing_exchange in the observer's retries and dead
// letters and in the log line's reason.
func TestFailuresAreCountedAndLoggedUnderTheirReason(t *testing.T) {
	t.Parallel()
	d := newDispatcher(t)
	logs := &testkit.Buffer{}
	d.cfg.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	obs := &reasonObserver{retried: map[string]int{}, dead: map[string]int{}}
	d.cfg.Observer = obs
	d.store.claim = claims(testBatch(0, 1, 2))
	d.pub.publish = func(_ context.Context, msgs []publish.Message) []error {
		return failAll(len(msgs), fmt.Errorf("%w: %q", publish.ErrExchangeNotFound, "gone"))
	}
	d.store.retry = func(context.Context, []claim.Failure) (claim.RetryResult, error) {
		return claim.RetryResult{Due: []time.Duration{time.Hour}, Dead: 1, DeadIndex: []int{1}}, nil
	}
	d.start(t)
	d.store.next(t, "claim")
	d.store.next(t, "retry")
	testkit.WaitFor(t, awaitTimeout, "the failure logged", func() bool {
		return strings.Contains(logs.String(), `"msg":"publish failed"`)
	})
	obs.mu.Lock()
	require.Equal(t, map[string]int{publish.ReasonMissingExchange: 1}, obs.retried)
	require.Equal(t, map[string]int{publish.ReasonMissingExchange: 1}, obs.dead)
	obs.mu.Unlock()
	require.Contains(t, logs.String(), `"reason":"`+publish.ReasonMissingExchange+`"`)
}
