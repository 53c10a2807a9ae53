package relay_test

import (
	"testing"
	"time"
)

// recheck is how soon recheckFloor wants a look again.
const recheck = 25 * time.Millisecond

// recheckFloor is a fakeFloor that wants a claim in recheck, as
// claim.Store.ParkedDue does after a claim could not take a due row that
// another transaction holds.
type recheckFloor struct{ fakeFloor }

func (f *recheckFloor) ParkedDue() (time.Duration, bool) { return recheck, true }

// A claim that comes back empty asks the poll loop for a wake-up when the
// floor's next look is due, without waiting for the advance loop's tick
// (an hour away here): a due row another transaction holds is claimed
// within recheck of its release, not within a tick.
func TestEmptyClaimWakesTheWorkersForTheFloorsRecheck(t *testing.T) {
	t.Parallel()
	d := newDispatcher(t)
	d.cfg.Floor = &recheckFloor{}
	d.cfg.AdvanceInterval = time.Hour
	d.start(t)
	d.store.next(t, "claim") // the start's, empty
	d.awaitTimer(t, "the recheck", recheck)
	d.advanceTo(t, "the recheck", recheck)
	d.store.next(t, "claim")
}
