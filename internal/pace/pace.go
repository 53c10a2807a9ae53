// Package pace aligns the relay's periodic loops on the wall clock. An
// idle relay's cost is mostly its wake-ups, each of which also wakes the Go
// runtime's threads; loops of one interval that wait for the same instant
// share one wake-up instead of each taking its own.
package pace

import "time"

// Next returns the first multiple of every, counted on the wall clock from
// the zero time, after now. Waiting for it, a loop that runs every `every`
// wakes at the same instants as every other loop that does.
func Next(now time.Time, every time.Duration) time.Time {
	return now.Truncate(every).Add(every)
}
