package pace_test

import (
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/internal/pace"
)

func TestNextIsTheFollowingMultipleOnTheWallClock(t *testing.T) {
	t.Parallel()
	base := time.Date(2026, 11, 27, 8, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		now  time.Duration
		want time.Duration
	}{
		{0, time.Second},
		{time.Nanosecond, time.Second},
		{999 * time.Millisecond, time.Second},
		{time.Second, 2 * time.Second},
		{1500 * time.Millisecond, 2 * time.Second},
	} {
		if got := pace.Next(base.Add(tc.now), time.Second); !got.Equal(base.Add(tc.want)) {
			t.Errorf("Next(+%s) = +%s, want +%s", tc.now, got.Sub(base), tc.want)
		}
	}
	// Two loops that start apart wake together.
	a, b := pace.Next(base.Add(123*time.Millisecond), time.Second), pace.Next(base.Add(877*time.Millisecond), time.Second)
	if !a.Equal(b) {
		t.Errorf("loops started apart wake at +%s and +%s", a.Sub(base), b.Sub(base))
	}
}
