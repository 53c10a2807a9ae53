package relay_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/relay"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// From 2 s up the fallback poll falls on a whole second, with the relay's
// other idle wake-ups, within its ±10% and half a second; a shorter one is
// jittered alone.
func TestFallbackPollFallsOnAWholeSecond(t *testing.T) {
	t.Parallel()
	clock := testkit.NewClock()
	clock.Advance(123456789 * time.Nanosecond)
	for range 200 {
		d := relay.NextPoll(relay.Config{PollInterval: 5 * time.Second, Clock: clock})
		at := clock.Now().Add(d)
		require.True(t, at.Equal(at.Truncate(time.Second)), "the poll falls at %s", at.Format(time.StampNano))
		require.GreaterOrEqual(t, d, 4500*time.Millisecond-time.Second/2)
		require.Less(t, d, 5500*time.Millisecond+time.Second/2)

		d = relay.NextPoll(relay.Config{PollInterval: 200 * time.Millisecond, Clock: clock})
		require.GreaterOrEqual(t, d, 180*time.Millisecond)
		require.LessOrEqual(t, d, 220*time.Millisecond)
	}
}
