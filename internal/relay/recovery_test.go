package relay_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/relay"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// fakeRecovery is a relay.Recovery. Probe and ReleaseLost record a call,
// "probe" and "release-lost", among the fake store's, so that a test reads
// the order of all; Rescue counts its calls.
type fakeRecovery struct {
	calls       chan storeCall
	probe       func(ctx context.Context) error
	releaseLost func(ctx context.Context) (int64, error)
	rescues     atomic.Int32
	rescued     atomic.Int64 // what the next Rescue returns, then 0
	watching    atomic.Bool
}

func (f *fakeRecovery) Probe(ctx context.Context) error {
	f.calls <- storeCall{op: "probe", ctx: ctx}
	if f.probe == nil {
		return nil
	}
	return f.probe(ctx)
}

func (f *fakeRecovery) Rescue(context.Context) (int64, error) {
	f.rescues.Add(1)
	return f.rescued.Swap(0), nil
}

func (f *fakeRecovery) Watching() bool { return f.watching.Load() }

func (f *fakeRecovery) ReleaseLost(ctx context.Context) (int64, error) {
	f.calls <- storeCall{op: "release-lost", ctx: ctx}
	if f.releaseLost == nil {
		return 0, nil
	}
	return f.releaseLost(ctx)
}

// After a claim that failed without the server's answer (a timeout), the
// relay probes the database every RecoverEvery and claims nothing
// meanwhile, woken or not; once the probe answers, it claims again at
// once, and gives back the rows of the claims whose outcome is unknown.
func TestClaimsWaitForTheDatabaseAfterAClaimItDidNotAnswer(t *testing.T) {
	t.Parallel()
	d := newDispatcher(t)
	probes := make(chan error)
	rec := &fakeRecovery{calls: d.store.calls, probe: func(context.Context) error { return <-probes }}
	d.cfg.Recovery = rec
	var claims atomic.Int32
	d.store.claim = func(context.Context) (claim.Batch, error) {
		if claims.Add(1) == 1 {
			return claim.Batch{}, fmt.Errorf("claim batch: %w", context.DeadlineExceeded)
		}
		return claim.Batch{}, nil
	}
	d.start(t)
	d.store.next(t, "claim") // the start's, which times out
	d.store.next(t, "probe")
	probes <- errors.New("probe: timeout") // the database does not answer

	// A wake-up, and the claim's own retry, find the database away: no
	// claim, until the next probe answers.
	d.listener.notify(t)
	d.awaitTimer(t, "the next probe", relay.RecoverEvery)
	d.clock.Advance(relay.RecoverEvery) // the claim's retry falls due too
	d.store.next(t, "probe")
	probes <- nil
	var ops []string // the claim and the release, in either order
	for range 2 {
		select {
		case c := <-d.store.calls:
			ops = append(ops, c.op)
		case <-time.After(awaitTimeout):
			t.Fatalf("after the probe answered: %v within %s", ops, awaitTimeout)
		}
	}
	require.ElementsMatch(t, []string{"claim", "release-lost"}, ops)
}

// A claim the server refused (its error rolled the claim back) is retried
// with backoff, as before: the database answers, so nothing is probed.
func TestClaimTheServerRefusedIsRetriedWithoutAProbe(t *testing.T) {
	t.Parallel()
	d := newDispatcher(t)
	d.cfg.Recovery = &fakeRecovery{calls: d.store.calls}
	var claims atomic.Int32
	d.store.claim = func(context.Context) (claim.Batch, error) {
		if claims.Add(1) == 1 {
			return claim.Batch{}, fmt.Errorf("claim batch: %w", &pgconn.PgError{Code: "57014", Message: "canceling statement due to statement timeout"})
		}
		return claim.Batch{}, nil
	}
	d.start(t)
	d.store.next(t, "claim")
	retry := d.clock.AwaitTimer(t, awaitTimeout, "the claim's retry", func(l time.Duration) bool { return l < time.Second })
	d.clock.Advance(retry)
	d.store.next(t, "claim") // not a probe first
}

// After every advance of the floor the relay has the Recovery rescue the
// rows of relays that died, and claims at once when it freed some. Idle,
// with nothing parked, it goes on advancing, and rescuing, every
// claim.RescueEvery while rows of other relays are watched (without them
// it waits for a kick: TestIdleRelayKeepsOneShortTimerUntilAClaim).
func TestIdleRelayLooksForDeadRelaysEverySecondWhileItWatchesTheirRows(t *testing.T) {
	t.Parallel()
	d := newDispatcher(t)
	floor := &fakeFloor{}
	rec := &fakeRecovery{calls: d.store.calls}
	rec.watching.Store(true)
	d.cfg.Floor, d.cfg.Recovery, d.cfg.Workers = floor, rec, 2
	const tick = 30 * time.Millisecond
	d.cfg.AdvanceInterval = tick
	var claims atomic.Int32
	first := holdFirstClaim(d, func() claim.Batch { claims.Add(1); return claim.Batch{} })
	d.start(t)
	t.Cleanup(first)
	d.discardCalls(t)

	// The first tick advances and rescues; the second finds nothing moved.
	d.clock.Advance(d.clock.AwaitTimer(t, awaitTimeout, "the advance loop's first tick", func(l time.Duration) bool { return l == tick }))
	testkit.WaitFor(t, awaitTimeout, "the first advance and rescue", func() bool {
		return floor.advances.Load() == 1 && rec.rescues.Load() == 1
	})
	d.clock.Advance(d.clock.AwaitTimer(t, awaitTimeout, "the advance loop's second tick", func(l time.Duration) bool { return l == tick }))
	for i := range int32(3) {
		d.awaitTimer(t, "the watch's tick", claim.RescueEvery)
		require.Equal(t, 1+i, rec.rescues.Load(), "no rescue before the watch's tick")
		d.advanceTo(t, "the watch's tick", claim.RescueEvery)
		testkit.WaitFor(t, awaitTimeout, "the tick's advance and rescue", func() bool {
			return floor.advances.Load() == 2+i && rec.rescues.Load() == 2+i
		})
		d.clock.Advance(d.clock.AwaitTimer(t, awaitTimeout, "the tick after", func(l time.Duration) bool { return l == tick }))
	}

	// A rescue that frees rows brings a claim (by the worker the held
	// first claim leaves free).
	rec.rescued.Store(3)
	d.awaitTimer(t, "the watch's tick", claim.RescueEvery)
	d.clock.Advance(claim.RescueEvery)
	testkit.WaitFor(t, awaitTimeout, "a claim after the rescue", func() bool { return claims.Load() == 1 })
}
