package testkit

import (
	"testing"
	"time"
)

// WaitFor checks cond every few milliseconds until it holds, failing the test
// with msg if it does not within timeout. It is for conditions no channel
// announces (a row's status, a backend's presence); prefer a channel when one
// exists.
func WaitFor(t testing.TB, timeout time.Duration, msg string, cond func() bool) {
	t.Helper()
	if !poll(timeout, 5*time.Millisecond, cond) {
		t.Fatalf("testkit: %s: not within %s", msg, timeout)
	}
}

// Eventually checks cond every 20 milliseconds until it holds (true) or
// timeout passes (false).
func Eventually(timeout time.Duration, cond func() bool) bool {
	return poll(timeout, 20*time.Millisecond, cond)
}

// poll checks cond every interval until it holds (true) or timeout passes
// (false).
func poll(timeout, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}
