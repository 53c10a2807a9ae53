package relay

import (
	"context"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/outboxrelay/outboxrelay/internal/pace"
)

// poll wakes the workers at start and then every PollInterval ±10%, on a
// whole second from 2 s up (nextPoll), so events whose notification was
// lost wait at most about that long. It also wakes them whenever a retry
// this relay scheduled falls due.
func (r *Relay) poll(ctx context.Context) {
	var due retrySchedule
	retry := clockTimer{clock: r.cfg.Clock} // armed for due[0] while anything is due
	defer retry.Stop()
	next := r.cfg.Clock.After(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-next:
			r.poke()
			next = r.cfg.Clock.After(r.nextPoll())
			continue
		case <-retry.C():
			r.poke()
			due.popUntil(r.cfg.Clock.Now())
		case d := <-r.retryDue:
			due.add(r.cfg.Clock.Now().Add(d))
		}
		retry.Stop()
		if len(due) > 0 {
			retry.Start(due[0].Sub(r.cfg.Clock.Now()))
		}
	}
}

// alignPollFrom is the shortest poll interval whose polls fall on the
// wall clock's whole seconds.
const alignPollFrom = 2 * time.Second

// nextPoll is how long until the next fallback poll: PollInterval, give or
// take a tenth at random, so that relays started together spread their
// polls. From alignPollFrom up the poll falls on the nearest whole second,
// with the idle reading of the sequence and the readiness round
// (pace.Next): an idle relay wakes once for all of them.
func (r *Relay) nextPoll() time.Duration {
	d := time.Duration(float64(r.cfg.PollInterval) * (0.9 + 0.2*rand.Float64()))
	if r.cfg.PollInterval < alignPollFrom {
		return d
	}
	now := r.cfg.Clock.Now()
	return pace.Next(now.Add(d-time.Second/2), time.Second).Sub(now)
}

// retrySchedule holds the times at which retries fall due, earliest first.
type retrySchedule []time.Time

// maxScheduledRetries bounds the schedule; a retry beyond it is found by the
// fallback poll.
const maxScheduledRetries = 1024

// retryResolution folds retries falling due this close together into one
// wake-up.
const retryResolution = 5 * time.Millisecond

// add schedules a wake-up at or a little after at, never before: a claim
// made before a retry's time would not see the row, and nothing would wake
// the relay again until the fallback poll.
func (s *retrySchedule) add(at time.Time) {
	i, _ := slices.BinarySearchFunc(*s, at, time.Time.Compare)
	if i < len(*s) && (*s)[i].Sub(at) < retryResolution {
		return // the next wake-up comes soon after at: it covers both
	}
	if i > 0 && at.Sub((*s)[i-1]) < retryResolution {
		(*s)[i-1] = at // the previous one would come too early: move it to at
		return
	}
	if len(*s) < maxScheduledRetries {
		*s = slices.Insert(*s, i, at)
	}
}

// popUntil drops every time up to now.
func (s *retrySchedule) popUntil(now time.Time) {
	i := 0
	for i < len(*s) && !(*s)[i].After(now) {
		i++
	}
	*s = (*s)[i:]
}

// wakeAfter asks the poll loop to wake the workers once d has passed.
func (r *Relay) wakeAfter(ctx context.Context, d time.Duration) {
	select {
	case r.retryDue <- d:
	case <-ctx.Done():
	}
}
