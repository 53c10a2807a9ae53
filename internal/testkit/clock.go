package testkit

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// Clock is a fake clock: its time stands still until Advance moves it, and
// its timers fire only then, so a test decides when anything timed happens.
// It has the methods of relay.Clock (Now, After, AfterFunc) without
// importing the relay. The zero value is not usable: use NewClock.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	seq    int
	timers []*fakeTimer // pending
	// added is closed, and replaced, whenever a timer is added.
	added chan struct{}
}

type fakeTimer struct {
	at  time.Time
	seq int // breaks ties: timers due at once fire in the order they were made
	f   func()
}

// NewClock returns a fake clock standing at 2025-01-01 00:00 UTC.
func NewClock() *Clock {
	return &Clock{now: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC), added: make(chan struct{})}
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// After returns a channel that receives the time once the clock has been
// advanced by d; at once if d <= 0.
func (c *Clock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.AfterFunc(d, func() { ch <- c.Now() })
	return ch
}

// AfterFunc calls f once the clock has been advanced by d, from the
// goroutine that calls Advance; at once, from the caller's, if d <= 0.
// stop removes the timer and reports whether it was pending.
func (c *Clock) AfterFunc(d time.Duration, f func()) (stop func() bool) {
	if d <= 0 {
		f()
		return func() bool { return false }
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &fakeTimer{at: c.now.Add(d), seq: c.seq, f: f}
	c.timers = append(c.timers, t)
	close(c.added)
	c.added = make(chan struct{})
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		i := slices.Index(c.timers, t)
		if i < 0 {
			return false
		}
		c.timers = slices.Delete(c.timers, i, i+1)
		return true
	}
}

// Advance moves the clock forward by d, firing every timer due by then in
// the order they fall due, the clock standing at each one's time as it
// fires, and returns how many fired. A timer that a fired one adds is fired
// too if it falls due within d.
func (c *Clock) Advance(d time.Duration) (fired int) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		i := c.next()
		if i < 0 || c.timers[i].at.After(end) {
			c.now = end
			c.mu.Unlock()
			return fired
		}
		t := c.timers[i]
		c.timers = slices.Delete(c.timers, i, i+1)
		c.now = t.at
		c.mu.Unlock()
		t.f()
		fired++
	}
}

// next returns the index of the timer due first, -1 if none is pending.
func (c *Clock) next() int {
	first := -1
	for i, t := range c.timers {
		if first < 0 || t.at.Before(c.timers[first].at) ||
			t.at.Equal(c.timers[first].at) && t.seq < c.timers[first].seq {
			first = i
		}
	}
	return first
}

// Pending returns how long each pending timer has left, shortest first.
func (c *Clock) Pending() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	left := make([]time.Duration, len(c.timers))
	for i, t := range c.timers {
		left[i] = t.at.Sub(c.now)
	}
	slices.Sort(left)
	return left
}

// AwaitTimer waits, in real time, until a pending timer has a time left
// that match accepts, and returns that time left; it fails the test with
// msg if none does within timeout. It is how a test learns that the code
// under test has armed a timer before it advances the clock past it.
func (c *Clock) AwaitTimer(t testing.TB, timeout time.Duration, msg string, match func(left time.Duration) bool) time.Duration {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		for _, tm := range c.timers {
			if left := tm.at.Sub(c.now); match(left) {
				c.mu.Unlock()
				return left
			}
		}
		added := c.added
		c.mu.Unlock()
		select {
		case <-added:
		case <-deadline.C:
			t.Fatalf("testkit: %s: no such timer within %s; pending: %v", msg, timeout, c.Pending())
		}
	}
}
