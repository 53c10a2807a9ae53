package relay_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/publish"
)

// fakeFloor is a relay.Floor with nothing unsettled that counts Advance.
type fakeFloor struct{ advances atomic.Int32 }

func (f *fakeFloor) Advance(context.Context) error    { f.advances.Add(1); return nil }
func (f *fakeFloor) Unsettled() bool                  { return false }
func (f *fakeFloor) ParkedDue() (time.Duration, bool) { return 0, false }
func (f *fakeFloor) Rescan()                          {}

// shortTimers is the relay's pending timers under a second: its loops'
// ticks, without the fallback poll and the minute's summary.
func shortTimers(d *dispatcher) []time.Duration {
	return slices.DeleteFunc(d.clock.Pending(), func(l time.Duration) bool { return l >= time.Second })
}

// An idle relay keeps one short timer: the gate's sample of the id
// sequence every 200 ms (the interval within which a lost notification is
// found). The floor's advance loop, which ticks every 50 ms while the relay
// claims, waits without a timer until a claim takes rows; then it ticks
// again, and so does the gate's rate sample.
func TestIdleRelayKeepsOneShortTimerUntilAClaim(t *testing.T) {
	t.Parallel()
	d := newDispatcher(t)
	floor := &fakeFloor{}
	d.cfg.Floor, d.cfg.Gate = floor, &fakeGate{closes: make(chan struct{}, 10)}
	batches := make(chan claim.Batch, 1)
	d.store.claim = func(context.Context) (claim.Batch, error) {
		select {
		case b := <-batches:
			return b, nil
		default:
			return claim.Batch{}, nil
		}
	}
	d.pub.publish = func(_ context.Context, msgs []publish.Message) []error { return make([]error, len(msgs)) }
	d.start(t)
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) }) // before the relay's own cleanup
	go func() {                       // the fakes' call records are not what this test reads
		for {
			select {
			case <-d.store.calls:
			case <-d.pub.calls:
			case <-stop:
				return
			}
		}
	}()

	// Both loops start at their busy pace; their first ticks find nothing
	// moved. Two seconds of the clock settle them.
	for elapsed := time.Duration(0); elapsed < 2*time.Second; {
		l := d.clock.AwaitTimer(t, awaitTimeout, "a loop's tick", func(l time.Duration) bool { return l < time.Second })
		d.clock.Advance(l)
		elapsed += l
	}
	// Idle: the gate samples every 200 ms, and no other timer falls due
	// before (advanceTo fails if one does); the floor is left alone.
	d.awaitTimer(t, "the idle sample", 200*time.Millisecond)
	idleAdvances := floor.advances.Load()
	for range 5 {
		d.advanceTo(t, "the idle sample", 200*time.Millisecond)
		d.awaitTimer(t, "the next idle sample", 200*time.Millisecond)
	}
	require.Equal(t, []time.Duration{200 * time.Millisecond}, shortTimers(d), "idle: the gate's sample alone")
	require.Equal(t, idleAdvances, floor.advances.Load(), "no advance while idle")

	// A notification brings a claim that takes rows: the floor advances at
	// once, without waiting for a tick, and ticks again.
	batches <- testBatch(time.Minute, 41, 42)
	d.listener.notify(t)
	d.clock.AwaitTimer(t, awaitTimeout, "the advance loop's tick", func(l time.Duration) bool { return l == 50*time.Millisecond })
	require.Greater(t, floor.advances.Load(), idleAdvances, "advanced on the claim")
	// The gate's next sample sees the claim and samples at 50 ms again.
	d.clock.Advance(d.clock.AwaitTimer(t, awaitTimeout, "the idle sample", func(l time.Duration) bool { return l > 50*time.Millisecond && l <= 200*time.Millisecond }))
	d.clock.AwaitTimer(t, awaitTimeout, "the busy sample", func(l time.Duration) bool { return l == 50*time.Millisecond })
}
