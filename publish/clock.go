package publish

import "time"

// Clock makes the timer of a batch's deadline (Config.ConfirmTimeout);
// *testkit.Clock has it, so tests can move time instead of waiting for it.
// Socket write deadlines and reconnect backoff keep the system clock: the
// kernel and the network run on it.
type Clock interface {
	// AfterFunc calls f in its own goroutine once d has passed; stop
	// cancels that unless it already happened, and reports whether it did
	// cancel it.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// systemClock is the default Clock.
type systemClock struct{}

func (systemClock) AfterFunc(d time.Duration, f func()) (stop func() bool) {
	return time.AfterFunc(d, f).Stop
}
