package relay

import (
	"context"
	"time"
)

// Clock is the relay's source of time: every timestamp, timer, retry wait
// and deadline of the relay's own comes from it, so a test can move time by
// hand. The timeouts of single database and broker calls are the store's,
// the publisher's and the gate's, and run on the system clock. The default
// is SystemClock.
type Clock interface {
	// Now is time.Now.
	Now() time.Time
	// After is time.After: a channel that receives once d has passed.
	After(d time.Duration) <-chan time.Time
	// AfterFunc is time.AfterFunc: it calls f in its own goroutine once d
	// has passed, unless stop is called first. stop reports whether it
	// prevented the call.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// SystemClock is the real clock, and the relay's default: its methods are
// time.Now, time.After and time.AfterFunc.
type SystemClock struct{}

// Now is time.Now.
func (SystemClock) Now() time.Time { return time.Now() }

// After is time.After.
func (SystemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// AfterFunc is time.AfterFunc.
func (SystemClock) AfterFunc(d time.Duration, f func()) (stop func() bool) {
	return time.AfterFunc(d, f).Stop
}

// clockTimer is a stoppable timer on a Clock, and a backoff.Timer. Each
// Start makes a fresh channel, so a timer stopped or started again never
// delivers the time of an earlier start; C is nil while it is stopped.
type clockTimer struct {
	clock Clock
	c     chan time.Time
	stop  func() bool
}

// Start arms the timer to fire once d has passed, stopping it first.
func (t *clockTimer) Start(d time.Duration) {
	t.Stop()
	c := make(chan time.Time, 1)
	clock := t.clock
	t.c = c
	t.stop = clock.AfterFunc(d, func() { c <- clock.Now() })
}

// Stop stops the timer; C is nil until the next Start.
func (t *clockTimer) Stop() {
	if t.stop != nil {
		t.stop()
	}
	t.c, t.stop = nil, nil
}

// C receives once when the timer fires.
func (t *clockTimer) C() <-chan time.Time { return t.c }

// withTimeout is context.WithTimeout on the relay's clock. The context's
// Err is context.Canceled either way; its cause is
// context.DeadlineExceeded when d ran out.
func (r *Relay) withTimeout(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	stop := r.cfg.Clock.AfterFunc(d, func() { cancel(context.DeadlineExceeded) })
	return ctx, func() {
		stop()
		cancel(context.Canceled)
	}
}
