package relay_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/relay"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/publish"
)

// fakeFloor is a relay.Floor with nothing unsettled that counts Advance.
type fakeFloor struct{ advances atomic.Int32 }

func (f *fakeFloor) Advance(context.Context) error    { f.advances.Add(1); return nil }
func (f *fakeFloor) Unsettled() bool                  { return false }
func (f *fakeFloor) ParkedDue() (time.Duration, bool) { return 0, false }
func (f *fakeFloor) Rescan()                          {}

// shortTimers is the relay's pending timers up to the idle sample's: its
// loops' ticks, without the fallback poll and the minute's summary.
func shortTimers(d *dispatcher) []time.Duration {
	return slices.DeleteFunc(d.clock.Pending(), func(l time.Duration) bool { return l > relay.IdleInsertsEvery })
}

// An idle relay keeps one short timer: the gate's sample of the id
// sequence every IdleInsertsEvery (the interval within which a lost notification is
// found). The floor's advance loop, which ticks every 50 ms while the relay
// claims, waits without a timer until a claim takes rows; then it ticks
// again, and so does the gate's rate sample.
func TestIdleRelayKeepsOneShortTimerUntilAClaim(t *testing.T) {
	t.Parallel()
	d := newDispatcher(t)
	floor := &fakeFloor{}
	d.cfg.Floor, d.cfg.Gate = floor, &fakeGate{closes: make(chan struct{}, 10)}
	// The advance loop's tick, apart from the gate's 50 ms sample.
	const tick = 30 * time.Millisecond
	d.cfg.AdvanceInterval = tick
	batches := make(chan claim.Batch, 1)
	first := holdFirstClaim(d, func() claim.Batch {
		select {
		case b := <-batches:
			return b
		default:
			return claim.Batch{}
		}
	})
	d.pub.publish = func(_ context.Context, msgs []publish.Message) []error { return make([]error, len(msgs)) }
	d.start(t)
	t.Cleanup(first)
	d.discardCalls(t) // the fakes' call records are not what this test reads

	// Both loops start at their busy pace. The advance loop's first tick
	// advances the floor (nothing was seen before); its second finds
	// nothing moved, and the loop waits for a kick, with no timer.
	d.clock.Advance(d.clock.AwaitTimer(t, awaitTimeout, "the advance loop's first tick", func(l time.Duration) bool { return l == tick }))
	testkit.WaitFor(t, awaitTimeout, "the first advance", func() bool { return floor.advances.Load() == 1 })
	d.clock.Advance(d.clock.AwaitTimer(t, awaitTimeout, "the advance loop's second tick", func(l time.Duration) bool { return l == tick }))
	// The gate's samples find nothing moved and slow down to the idle
	// sample.
	for {
		l := d.clock.AwaitTimer(t, awaitTimeout, "the gate's sample", func(l time.Duration) bool { return l <= relay.IdleInsertsEvery })
		if l == relay.IdleInsertsEvery {
			break
		}
		d.clock.Advance(l)
	}
	// Idle: the gate samples every IdleInsertsEvery, and no other timer falls due
	// before (advanceTo fails if one does); the floor is left alone.
	for range 5 {
		d.advanceTo(t, "the idle sample", relay.IdleInsertsEvery)
		d.awaitTimer(t, "the next idle sample", relay.IdleInsertsEvery)
	}
	require.Equal(t, []time.Duration{relay.IdleInsertsEvery}, shortTimers(d), "idle: the gate's sample alone")
	require.Equal(t, int32(1), floor.advances.Load(), "no advance while idle")

	// The start's claim, held until now, comes back empty: the floor
	// advances once, at once, to park what the claim could not take; one
	// tick later, nothing moved, and it rests again.
	first()
	testkit.WaitFor(t, awaitTimeout, "an advance on the empty claim", func() bool { return floor.advances.Load() == 2 })
	d.clock.Advance(d.clock.AwaitTimer(t, awaitTimeout, "the tick after the empty claim", func(l time.Duration) bool { return l == tick }))

	// A notification brings a claim that takes rows: the floor advances at
	// once, without waiting for a tick, and ticks again.
	batches <- testBatch(time.Minute, 41, 42)
	d.listener.notify(t)
	testkit.WaitFor(t, awaitTimeout, "an advance on the claim", func() bool { return floor.advances.Load() == 3 })
	d.clock.AwaitTimer(t, awaitTimeout, "the advance loop's tick", func(l time.Duration) bool { return l == tick })
	// The gate's next sample sees the claim and samples at 50 ms again.
	d.clock.Advance(d.clock.AwaitTimer(t, awaitTimeout, "the idle sample", func(l time.Duration) bool { return l > tick && l <= relay.IdleInsertsEvery }))
	d.clock.AwaitTimer(t, awaitTimeout, "the busy sample", func(l time.Duration) bool { return l == 50*time.Millisecond })
}

// parkedFloor is a fakeFloor holding parked rows, the first due in an hour.
type parkedFloor struct{ fakeFloor }

func (f *parkedFloor) ParkedDue() (time.Duration, bool) { return time.Hour, true }

// With rows parked far ahead (a reminder due tomorrow) and nothing else to
// do, the advance loop rereads them once every claim.ParkedRereadEvery,
// not at its busy tick; and a claim that comes back empty (a notification
// for a row not yet due) advances the floor at once, so that it parks the
// new row and the relay wakes at its time.
func TestIdleFloorWithParkedRowsAdvancesOnceASecond(t *testing.T) {
	t.Parallel()
	d := newDispatcher(t)
	floor := &parkedFloor{}
	d.cfg.Floor = floor
	const tick = 30 * time.Millisecond
	d.cfg.AdvanceInterval = tick
	first := holdFirstClaim(d, func() claim.Batch { return claim.Batch{} })
	d.start(t)
	t.Cleanup(first)
	d.discardCalls(t)

	// The first tick advances (nothing was seen before); the second finds
	// nothing moved.
	d.clock.Advance(d.clock.AwaitTimer(t, awaitTimeout, "the advance loop's first tick", func(l time.Duration) bool { return l == tick }))
	testkit.WaitFor(t, awaitTimeout, "the first advance", func() bool { return floor.advances.Load() == 1 })
	d.clock.Advance(d.clock.AwaitTimer(t, awaitTimeout, "the advance loop's second tick", func(l time.Duration) bool { return l == tick }))
	for i := range int32(3) {
		d.awaitTimer(t, "the parked rows' reread", claim.ParkedRereadEvery)
		for _, l := range shortTimers(d) {
			require.Equal(t, claim.ParkedRereadEvery, l, "resting: no timer before the reread's (the gate's sample is as long)")
		}
		require.Equal(t, 1+i, floor.advances.Load(), "no advance before the reread")
		d.advanceTo(t, "the reread", claim.ParkedRereadEvery)
		testkit.WaitFor(t, awaitTimeout, "the reread's advance", func() bool { return floor.advances.Load() == 2+i })
		// One tick later, nothing moved: back to rest.
		d.clock.Advance(d.clock.AwaitTimer(t, awaitTimeout, "the tick after the reread", func(l time.Duration) bool { return l == tick }))
	}

	// The start's claim, held until now, comes back empty.
	d.awaitTimer(t, "the parked rows' reread", claim.ParkedRereadEvery)
	first()
	testkit.WaitFor(t, awaitTimeout, "an advance on the empty claim", func() bool { return floor.advances.Load() == 5 })
}

// holdFirstClaim makes the relay's claims return what next gives, but
// holds the first one (the claim every relay makes at its start) until the
// returned function is called, so that a test decides when the empty
// claim's advance comes. The test registers release as a cleanup after
// starting the relay, so that it runs before the relay's own.
func holdFirstClaim(d *dispatcher, next func() claim.Batch) (release func()) {
	held := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(held) }) }
	var calls atomic.Int32
	d.store.claim = func(context.Context) (claim.Batch, error) {
		if calls.Add(1) == 1 {
			<-held
		}
		return next(), nil
	}
	return release
}
