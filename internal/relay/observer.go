package relay

import "time"

// Observer is told what the relay does, for metrics (*metrics.Metrics has
// it). Its methods are called from the relay's workers on the hot path:
// they must be cheap, never block, and be safe for concurrent use.
type Observer interface {
	// Claimed reports one claim statement that took events (0 for an
	// empty claim) in took.
	Claimed(events int, took time.Duration)
	// Published reports events confirmed by the broker and marked
	// published, each with its lag from its created_at to its confirm,
	// and the batch's publish time, from its first publish to its last
	// confirm.
	Published(lags []time.Duration, took time.Duration)
	// Retried reports n events put back for another attempt after a
	// failure of the given reason (publish.Reason).
	Retried(reason string, n int)
	// DeadLettered reports n events dead-lettered after a failure of the
	// given reason (publish.Reason).
	DeadLettered(reason string, n int)
	// Released reports n events given back unpublished, without counting
	// an attempt.
	Released(n int)
	// GateClosed reports whether the relay has closed the notification
	// gate (see Config.Gate).
	GateClosed(closed bool)
}

// noObserver is the default Observer: it does nothing.
type noObserver struct{}

func (noObserver) Claimed(int, time.Duration)               {}
func (noObserver) Published([]time.Duration, time.Duration) {}
func (noObserver) Retried(string, int)                      {}
func (noObserver) DeadLettered(string, int)                 {}
func (noObserver) Released(int)                             {}
func (noObserver) GateClosed(bool)                          {}
