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
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("testkit: %s: not within %s", msg, timeout)
		}
		<-tick.C
	}
}
