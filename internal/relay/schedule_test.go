package relay

import (
	"testing"
	"time"
)

// Every retry added to the schedule gets a wake-up at or soon after its
// time, never before it: two retries 2 ms apart (the jitter of one batch's
// failures) used to share the earlier wake-up, which came before the later
// row was claimable and left it to the fallback poll.
func TestRetryScheduleNeverWakesBeforeARetryIsDue(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, offsets := range [][]time.Duration{
		{0, 2 * time.Millisecond},
		{2 * time.Millisecond, 0},
		{0, 4 * time.Millisecond, 8 * time.Millisecond},
		{10 * time.Millisecond, 0, 6 * time.Millisecond, 3 * time.Millisecond},
	} {
		var s retrySchedule
		for _, d := range offsets {
			s.add(t0.Add(d))
		}
		for _, d := range offsets {
			at := t0.Add(d)
			covered := false
			for _, e := range s {
				if !e.Before(at) && e.Sub(at) < 2*retryResolution {
					covered = true
				}
			}
			if !covered {
				t.Errorf("offsets %v: no wake-up at or soon after %v in %v", offsets, d, s)
			}
		}
	}
}
