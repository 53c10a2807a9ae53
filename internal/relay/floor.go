package relay

import (
	"context"
	"errors"
	"time"

	"github.com/outboxrelay/outboxrelay/claim"
)

// Floor moves where claims start; *claim.Store has it (see
// claim.Store.Advance).
type Floor interface {
	// Advance moves the floor as far as it may go.
	Advance(ctx context.Context) error
	// Unsettled reports whether Advance has work left that no claim will
	// bring and that cannot wait (a sweep under way, a frontier to move).
	Unsettled() bool
	// ParkedDue is how long until the earliest parked row falls due, or
	// a row above the floor the floor watches (one it could not park, or
	// a due one a claim could not take, looked at again), and whether
	// there is any.
	ParkedDue() (time.Duration, bool)
	// Rescan sweeps below the floor for rows made pending there by other
	// means than a relay's own.
	Rescan()
}

// requeueSignals is what the listener (*notify.Listener) tells of requeue
// notifications: dead letters put back, below the floor.
type requeueSignals interface {
	Requeues() uint64
}

// advance moves the Floor every AdvanceInterval while the relay claims or
// the floor has work left, asks the poll loop to wake the workers when
// parked rows fall due, has the floor rescanned after a requeue, and after
// each advance has the Recovery rescue the rows of relays that died.
//
// An idle relay keeps no timer here but, while rows are parked or it knows
// of rows other relays hold (Recovery.Watching), one for their reread
// every claim.ParkedRereadEvery (claim.RescueEvery): once an advance finds
// nothing moved and nothing unsettled, the loop waits for a kick
// (kickAdvance), which a mark, an empty claim and the gate's steering
// send. A mark kicks it because the floor may rise past the rows marked
// (not their claim: until their mark they hold the floor); a claim that
// came back empty, so that the floor parks what it could not take, with
// the time each falls due: a scheduled event written to an idle relay
// wakes it at its time; the steering when it sees a requeue at one of its
// samples (every IdleInsertsEvery while idle).
func (r *Relay) advance(ctx context.Context) {
	f := r.cfg.Floor
	requeues, _ := r.listener.(requeueSignals)
	var seen int64 = -1 // the highest id claimed at the last advance
	var requeued uint64
	if requeues != nil {
		requeued = requeues.Requeues()
	}
	idle := false
	for {
		// Busy, the loop ticks and a kick waits in its buffer; idle, it
		// waits for the kick alone, or, with rows parked, for the time
		// to reread them. (Listening to kicks while busy would advance
		// once per claim: a round trip per claim at steady rates.)
		var tick <-chan time.Time
		var kick <-chan struct{}
		watch := false // rows parked, or leased by other relays: look again
		if idle {
			kick = r.advanceKick
			_, parked := f.ParkedDue()
			if watch = parked || r.watching(); watch {
				tick = r.cfg.Clock.After(min(claim.ParkedRereadEvery, claim.RescueEvery))
			}
		} else {
			tick = r.cfg.Clock.After(r.cfg.AdvanceInterval)
		}
		reread := false
		select {
		case <-ctx.Done():
			return
		case <-tick:
			reread = watch
		case <-kick:
		}
		if requeues != nil {
			if n := requeues.Requeues(); n != requeued {
				requeued = n
				f.Rescan()
			}
		}
		claimed := r.meter.maxID.Load()
		look := r.lookAhead.Swap(false) // this advance covers the empty claims so far
		idle = false
		if claimed == seen && !f.Unsettled() && !look && !reread {
			idle = true // nothing moved: wait for a kick
			continue
		}
		seen = claimed
		err := f.Advance(ctx)
		switch {
		case errors.Is(err, claim.ErrNoFrontier):
			r.log.Info("claims start at the head of the pending index", "err", err)
			return
		case err != nil && ctx.Err() == nil:
			r.log.Warn("moving the claims' floor failed", "err", err)
		case err == nil:
			r.rescue(ctx)
		}
		r.wakeForParked()
	}
}

// wakeForParked asks the poll loop to wake the workers when the earliest
// parked or watched row falls due (Floor.ParkedDue). The advance loop asks
// after each advance, and a claim after it took rows (they may have been
// the earliest: the next one is then due sooner than the advance loop's
// next tick) or none (a due row it could not take is to be looked at
// again sooner than that tick too).
func (r *Relay) wakeForParked() {
	if r.cfg.Floor == nil {
		return
	}
	if d, ok := r.cfg.Floor.ParkedDue(); ok {
		select {
		case r.retryDue <- d:
		default:
		}
	}
}

// kickAdvance wakes the advance loop if it is idle.
func (r *Relay) kickAdvance() {
	select {
	case r.advanceKick <- struct{}{}:
	default:
	}
}
