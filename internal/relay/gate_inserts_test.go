package relay_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/relay"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// recordingGate is a relay.Gate that reports whether it is open. With
// lostCloses, a Close sets the gate and then fails: a statement that ran
// but whose answer was lost (a connection cut, a context ended).
type recordingGate struct {
	open       atomic.Bool
	lostCloses atomic.Bool
}

func (g *recordingGate) Open(context.Context) error { g.open.Store(true); return nil }
func (g *recordingGate) Close(context.Context) error {
	g.open.Store(false)
	if g.lostCloses.Load() {
		return errors.New("close gate: conn closed")
	}
	return nil
}
func (g *recordingGate) TTL() time.Duration { return time.Hour }

// fakeInserts is a relay.Inserts whose id sequence and NOTIFY lock waiters
// the test sets.
type fakeInserts struct{ last, waiters atomic.Int64 }

func (f *fakeInserts) LastInsertID(context.Context) (int64, error) { return f.last.Load(), nil }
func (f *fakeInserts) NotifyWaiters(context.Context) (int, error) {
	return int(f.waiters.Load()), nil
}

// A relay that falls behind its producers (starved of CPU: it claims one
// event per 50 ms, while they insert 20,000 a second) keeps the gate
// closed for as long as they insert so fast, because it reads their pace
// from the id sequence; read from the ids it claims (20/s), the rate would
// fall below half of BusyRate and open the gate, and every insert would
// notify again. Once the producers stop, the gate opens.
func TestRelayBehindItsProducersKeepsTheGateClosed(t *testing.T) {
	t.Parallel()
	g := startGateRun(t, 100)
	closed, reopened := g.run(3*time.Second, 20_000)
	require.True(t, closed, "the relay never closed the gate while producers inserted 20,000/s")
	require.False(t, reopened, "the relay opened the gate while producers still inserted 20,000/s")
	_, reopened = g.run(time.Second, 0)
	require.True(t, reopened, "the gate stayed closed once the producers stopped")
}

// Producers queued on PostgreSQL's NOTIFY lock close the gate below
// BusyRate: a server whose WAL flush is slow lets notifying producers
// commit only one flush at a time, 1,000/s say, below BusyRate (2,000/s),
// and the rate alone would never close the gate. Without waiters the gate
// stays open at that rate; with them it closes, stays closed while the
// producers keep up 600/s, and opens once they stop.
func TestProducersQueuedOnTheNotifyLockCloseTheGateBelowBusyRate(t *testing.T) {
	t.Parallel()
	g := startGateRun(t, 2000)
	closed, _ := g.run(time.Second, 1000)
	require.False(t, closed, "the gate closed at 1,000/s, half of BusyRate, with nobody waiting on the NOTIFY lock")

	g.inserts.waiters.Store(30)
	closed, reopened := g.run(time.Second, 1000)
	require.True(t, closed, "the gate stayed open while 30 producers waited on the NOTIFY lock")
	require.False(t, reopened, "the gate opened again while producers still inserted 1,000/s")
	g.inserts.waiters.Store(0) // a closed gate sends no NOTIFY: nobody waits
	_, reopened = g.run(time.Second, 600)
	require.False(t, reopened, "the gate opened while producers inserted 600/s, above a quarter of the rate it closed at")
	_, reopened = g.run(time.Second, 0)
	require.True(t, reopened, "the gate stayed closed once the producers stopped")
}

// With the default BusyRate, a single producer connection that notifies
// closes the gate: beside a relay claiming each of its notifications it
// commits 1,000 to 1,600 times a second on a 2-core machine, and would
// keep paying for NOTIFY at that rate below a busy rate of 2,000/s
// (decision 0009). At 400/s the gate stays open: a claim per notification
// costs less there than a busy poll.
func TestTheDefaultBusyRateClosesTheGateForOneNotifyingProducer(t *testing.T) {
	t.Parallel()
	g := startGateRun(t, 0)
	closed, _ := g.run(time.Second, 400)
	require.False(t, closed, "the gate closed at 400 inserts/s")
	closed, _ = g.run(time.Second, 1200)
	require.True(t, closed, "the gate stayed open at 1,200 inserts/s, a single notifying producer's pace")
}

// A burst after a quiet spell is measured from its first claim: the
// steering, resting until its next idle sample a whole IdleInsertsEvery
// away, wakes at that claim, and the gate closes at the next rate sample,
// so the burst's producers stop paying for NOTIFY within 50 ms. Measured
// from the idle sample instead, they would notify for up to two seconds.
func TestABurstAfterAQuietSpellClosesTheGateAtItsFirstSamples(t *testing.T) {
	t.Parallel()
	g := startGateRun(t, 1000)
	d := g.d
	g.silent = true // nothing inserted, nothing notified
	g.run(3*time.Second, 0)
	g.silent = false
	// Step the clock until the steering rests for a whole IdleInsertsEvery
	// (a quiet sample on one of its instants); the fallback poll's claims
	// may keep it sampling every 50 ms for a while.
	for i := 0; ; i++ {
		left := d.clock.AwaitTimer(t, awaitTimeout, "the gate's timer", func(l time.Duration) bool { return l <= relay.IdleInsertsEvery })
		if left == relay.IdleInsertsEvery {
			break
		}
		if i == 200 {
			t.Fatalf("the steering never rested for a whole %s; pending: %v", relay.IdleInsertsEvery, d.clock.Pending())
		}
		d.clock.Advance(left)
	}
	const perStep = 1000 // 20,000 inserts a second, in steps of the rate sample
	start := d.clock.Now()
	g.inserts.last.Add(perStep)
	d.listener.notify(t) // the burst's first notification, and its claim
	d.listener.awaitIdle(t)
	for g.gate.open.Load() {
		left := d.clock.AwaitTimer(t, awaitTimeout, "a rate sample after the burst's first claim",
			func(l time.Duration) bool { return l > 0 && l <= 50*time.Millisecond })
		d.clock.Advance(left)
		if d.clock.Now().Sub(start) > time.Second {
			t.Fatalf("the gate stayed open %s into a burst of 20,000 inserts/s", d.clock.Now().Sub(start))
		}
		g.inserts.last.Add(perStep * int64(left) / int64(50*time.Millisecond))
		if g.gate.open.Load() {
			d.listener.notify(t)
			d.listener.awaitIdle(t)
		}
	}
	require.LessOrEqual(t, d.clock.Now().Sub(start), 100*time.Millisecond, "the gate closed late into the burst")
}

// An open gate whose notifications do not come (the trigger disabled, a
// notification lost) follows the id sequence all the same: with nothing
// claimed it reads the sequence every IdleInsertsEvery, claims when the sequence
// passed the ids claimed, and closes the gate while producers insert
// 20,000/s, as it would had every insert notified. A relay that read the
// sequence only after a claim would claim nothing here (the fallback poll
// is an hour away) and keep the gate open.
func TestAnOpenGateWithoutNotificationsFollowsTheSequence(t *testing.T) {
	t.Parallel()
	g := startGateRun(t, 100)
	g.silent = true
	g.awaitBatches(1, "the claim at start")
	closed, _ := g.run(relay.IdleInsertsEvery+100*time.Millisecond, 0)
	require.False(t, closed, "the gate closed with no inserts")
	g.inserts.last.Add(5) // five inserts (25/s), whose notifications never come
	g.run(relay.IdleInsertsEvery+100*time.Millisecond, 0)
	g.awaitBatches(2, "a claim once the sequence moved")
	closed, _ = g.run(relay.IdleInsertsEvery+100*time.Millisecond, 20_000)
	require.True(t, closed, "the gate stayed open while producers inserted 20,000/s without notifying")
}

// Inserts that a reading of the sequence shows while the relay is claiming
// are claimed later if their notifications never come: here the relay's
// first claim, at start, takes one event, and its first reading of the
// sequence, taken in the same 50 ms, shows five. A relay that woke a
// claim only for a sequence that moved since its last reading would never
// claim the other four (the fallback poll is an hour away); this one
// claims once it has gone a sample without claiming.
func TestInsertsSeenWhileClaimingAreClaimedWithoutNotifications(t *testing.T) {
	t.Parallel()
	g := startGateRunAt(t, 100, 5)
	g.silent = true
	g.awaitBatches(1, "the claim at start")
	g.run(relay.IdleInsertsEvery+100*time.Millisecond, 0)
	g.awaitBatches(2, "a claim for the four inserts left")
}

// The first reading of the id sequence is where it stands: a table that
// has seen a million inserts before the relay started does not read as a
// million inserts in the first second, and a trickle of events leaves the
// gate open.
func TestTheSequencesHistoryIsNoBurst(t *testing.T) {
	t.Parallel()
	g := startGateRun(t, 100)
	g.inserts.last.Store(1_000_000)
	g.silent = true // the relay waits, idle, for its first notification
	closed, _ := g.run(relay.IdleInsertsEvery+100*time.Millisecond, 0)
	require.False(t, closed)
	g.silent = false
	closed, _ = g.run(time.Second, 10)
	require.False(t, closed, "the gate closed at 10 inserts/s: the sequence's first reading was taken for a burst")
}

// A Close whose answer is lost (a connection cut, a context ended by
// shutdown) may have closed the gate all the same: the relay then opens it
// on its way out, as it does when it knows the gate closed, so the relays
// that stay are woken by notifications.
func TestLostCloseIsUndoneAtShutdown(t *testing.T) {
	t.Parallel()
	g := startGateRun(t, 100)
	g.gate.lostCloses.Store(true)
	closed, _ := g.run(time.Second, 20_000)
	require.True(t, closed, "the relay never tried to close the gate at 20,000 inserts/s")
	g.d.cancel()
	select {
	case err := <-g.d.done:
		g.d.done <- err // for the test's cleanup
	case <-time.After(awaitTimeout):
		t.Fatal("the relay did not stop")
	}
	require.True(t, g.gate.open.Load(), "the relay left the gate closed")
}

// gateRun drives a relay whose store claims one event per 50 ms (a relay
// starved of CPU) with a recordingGate and fakeInserts, on a fake clock.
type gateRun struct {
	t       *testing.T
	d       *dispatcher
	gate    *recordingGate
	inserts *fakeInserts
	owed    float64      // inserts due but not yet a whole one
	silent  bool         // no notifications
	batches atomic.Int64 // the claims that found an event
}

func startGateRun(t *testing.T, busyRate float64) *gateRun {
	return startGateRunAt(t, busyRate, 0)
}

// startGateRunAt is startGateRun with the id sequence at last when the
// relay starts.
func startGateRunAt(t *testing.T, busyRate float64, last int64) *gateRun {
	d := newDispatcher(t)
	gate, inserts := &recordingGate{}, &fakeInserts{}
	inserts.last.Store(last)
	gate.open.Store(true) // as the relay's start leaves it
	d.cfg.Gate, d.cfg.Inserts = gate, inserts
	d.cfg.BusyRate, d.cfg.BusyPollInterval = busyRate, 2*time.Millisecond
	var (
		mu       sync.Mutex
		lastID   int64
		lastTake time.Time
	)
	g := &gateRun{t: t, d: d, gate: gate, inserts: inserts}
	d.store.claim = func(context.Context) (claim.Batch, error) {
		mu.Lock()
		defer mu.Unlock()
		if now := d.clock.Now(); now.Sub(lastTake) >= 50*time.Millisecond {
			lastTake, lastID = now, lastID+1
			g.batches.Add(1)
			return testBatch(time.Minute, lastID), nil
		}
		return claim.Batch{}, nil
	}
	stop := make(chan struct{})
	var drained sync.WaitGroup
	drained.Go(func() {
		for {
			select {
			case <-d.store.calls:
			case <-d.pub.calls:
			case <-stop:
				return
			}
		}
	})
	d.start(t)
	t.Cleanup(func() { close(stop); drained.Wait() })
	return g
}

// awaitBatches waits until the store's claims have found n events: claims
// run in their own goroutines, in real time, while the clock stands still.
func (g *gateRun) awaitBatches(n int64, what string) {
	g.t.Helper()
	testkit.WaitFor(g.t, awaitTimeout, what, func() bool { return g.batches.Load() >= n })
}

// run advances the clock by total, step by step of the gate's own timer
// (the 50 ms rate sample while open, IdleInsertsEvery while open and idle, the 2 ms
// busy poll while closed).
// Producers insert perSecond meanwhile; while the gate is open, each step
// brings a notification, as the trigger would send, unless silent. It
// returns whether the gate was ever closed, and whether it opened after it
// was first closed.
func (g *gateRun) run(total time.Duration, perSecond int64) (closed, reopened bool) {
	t, d := g.t, g.d
	for elapsed := time.Duration(0); elapsed < total; {
		left := d.clock.AwaitTimer(t, awaitTimeout, "the gate's timer", func(l time.Duration) bool { return l <= relay.IdleInsertsEvery })
		g.owed += float64(perSecond) * left.Seconds()
		whole := int64(g.owed)
		g.inserts.last.Add(whole)
		g.owed -= float64(whole)
		if g.gate.open.Load() && !g.silent {
			// The notification is handled, its claim made, before the
			// clock moves on, as a notification is within the 50 ms of a
			// step in real time.
			d.listener.notify(t)
			d.listener.awaitIdle(t)
		}
		d.clock.Advance(left)
		elapsed += left
		switch open := g.gate.open.Load(); {
		case !open:
			closed = true
		case closed:
			reopened = true
		}
	}
	return closed, reopened
}
