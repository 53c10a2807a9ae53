package relay_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/relay"
	"github.com/outboxrelay/outboxrelay/publish"
)

// fakeGate is a relay.Gate that reports each Close.
type fakeGate struct{ closes chan struct{} }

func (g *fakeGate) Open(context.Context) error { return nil }
func (g *fakeGate) Close(context.Context) error {
	g.closes <- struct{}{}
	return nil
}
func (g *fakeGate) TTL() time.Duration { return time.Hour }

// A busy ordered relay (gate closed, polling every 2 ms) does not poll while
// a batch is in flight and its claim found no other claimable aggregate:
// such a poll would walk every aggregate to find nothing, and the worker in
// flight claims again once its batch settles. With nothing in flight, the
// polls resume.
func TestBusyOrderedRelaySparesItsPollsWhileABatchIsInFlight(t *testing.T) {
	t.Parallel()
	d := newDispatcher(t)
	gate := &fakeGate{closes: make(chan struct{}, 10)}
	d.cfg.Workers, d.cfg.Ordered, d.cfg.Gate = 2, true, gate
	d.cfg.BusyRate, d.cfg.BusyPollInterval = 100, 2*time.Millisecond
	// The first claim waits for its batch; every later one finds nothing.
	claimed := make(chan claim.Batch)
	var calls atomic.Int32
	d.store.claim = func(context.Context) (claim.Batch, error) {
		if calls.Add(1) == 1 {
			return <-claimed, nil
		}
		return claim.Batch{}, nil
	}
	settle := make(chan struct{})
	release := sync.OnceFunc(func() { close(settle) })
	d.pub.publish = func(_ context.Context, msgs []publish.Message) []error {
		<-settle
		return make([]error, len(msgs))
	}
	d.start(t)
	t.Cleanup(release) // before the relay's own cleanup waits for Run
	d.store.next(t, "claim")

	// The rate sample's timer: 50 ms, or a second while the relay is idle.
	sampleTimer := func() time.Duration {
		t.Helper()
		return d.clock.AwaitTimer(t, awaitTimeout, "the rate sample", func(l time.Duration) bool { return l <= relay.IdleInsertsEvery })
	}
	sample := func() {
		t.Helper()
		d.clock.Advance(sampleTimer())
	}
	sample()
	// Once the next sample's timer is set, the first one (the meter at 0)
	// is taken.
	sampleTimer()
	// Ids up to 1,000 claimed after a quiet first sample: the claim wakes
	// the resting steering, whose next sample, 50 ms later, reads
	// 20,000/s, far past BusyRate. The claim found no other claimable
	// aggregate (More unset).
	claimed <- orderedBatch(map[int64]string{1: "A", 1000: "B"})
	d.pub.next(t)
	d.clock.Advance(d.clock.AwaitTimer(t, awaitTimeout, "the burst's first rate sample", func(l time.Duration) bool { return l == 50*time.Millisecond }))
	select {
	case <-gate.closes:
	case <-time.After(awaitTimeout):
		t.Fatal("the gate was not closed")
	}
	before := calls.Load()
	for range 20 {
		d.awaitTimer(t, "the busy poll", 2*time.Millisecond)
		d.clock.Advance(2 * time.Millisecond)
	}
	// The start-up's second poke may still reach the idle worker (pokes
	// coalesce, so there is one claim or none); a poll would add up to 20.
	require.LessOrEqual(t, calls.Load()-before, int32(1), "claims while a batch was in flight")

	// The batch settles, its worker claims again and finds nothing: with
	// nothing in flight, the busy polls claim again.
	release()
	for marked := false; !marked; {
		select {
		case c := <-d.store.calls:
			marked = c.op == "mark"
		case <-time.After(awaitTimeout):
			t.Fatal("the settled batch was not marked")
		}
	}
	// The worker claims again once its batch is marked, and finds nothing.
	awaitClaim := func(what string) {
		t.Helper()
		for {
			select {
			case c := <-d.store.calls:
				if c.op == "claim" {
					return
				}
			case <-time.After(awaitTimeout):
				t.Fatal(what)
			}
		}
	}
	awaitClaim("the worker did not claim again once its batch was marked")
	// The next busy poll claims: the relay pokes a worker, which may run
	// only after the clock has moved on, so await its claim.
	d.awaitTimer(t, "the busy poll", 2*time.Millisecond)
	d.clock.Advance(2 * time.Millisecond)
	awaitClaim("no busy poll claimed once nothing was in flight")
}
