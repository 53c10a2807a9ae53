//go:build faults

package faults

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/testkit"
)

// Short leases and polls, so that a killed relay's claims come back within
// seconds; the confirm timeout stays below the lease, as the relay demands.
var crashArgs = []string{"--lease=2s", "--confirm-timeout=1500ms", "--poll-interval=500ms"}

const drainEvents = 50000

// Scenario 1: the relay is killed with SIGKILL at a random point of a drain
// of 50,000 events, then started again; every run must deliver every event.
func TestKillDuringDrain(t *testing.T) {
	w := newWorld(t)
	r := rng(t)
	o := outcome{Scenario: "1 SIGKILL during a drain"}
	for run := range 20 {
		tag := fmt.Sprintf("kill-%d", run)
		w.insert(tag, drainEvents)
		p := w.relay(crashArgs...)
		at := r.IntN(drainEvents - 1000)
		w.count.waitDistinct(t, tag, at, 2*time.Minute)
		p.Kill()
		killed := time.Now()

		p = w.relay(crashArgs...)
		w.count.waitDistinct(t, tag, drainEvents, 2*time.Minute)
		testkit.WaitFor(t, time.Minute, "every event marked published", func() bool { return w.published(tag) == drainEvents })
		p.Stop(time.Minute)
		distinct, dups, last := w.count.stats(tag)
		t.Logf("run %d: killed after %d deliveries; %d delivered, %d duplicates, recovered in %s",
			run, at, distinct, dups, last.Sub(killed).Round(time.Millisecond))
		o.Runs++
		o.Committed += drainEvents
		o.Delivered += distinct
		o.Lost += drainEvents - distinct
		o.Duplicated += dups
		o.Recovery = append(o.Recovery, last.Sub(killed))
	}
	record(o)
	require.Zero(t, o.Lost)
}

// Scenario 2: SIGTERM at a random point of a drain, 10 times: the relay
// settles what is in flight and releases the rest, so after the restart no
// event arrives twice.
func TestTermDuringDrain(t *testing.T) {
	w := newWorld(t)
	r := rng(t)
	o := outcome{Scenario: "2 SIGTERM during a drain"}
	for run := range 10 {
		tag := fmt.Sprintf("term-%d", run)
		w.insert(tag, drainEvents)
		p := w.relay(crashArgs...)
		at := r.IntN(drainEvents - 1000)
		w.count.waitDistinct(t, tag, at, 2*time.Minute)
		stopped := time.Now()
		p.Stop(time.Minute)

		p = w.relay(crashArgs...)
		w.count.waitDistinct(t, tag, drainEvents, 2*time.Minute)
		testkit.WaitFor(t, time.Minute, "every event marked published", func() bool { return w.published(tag) == drainEvents })
		p.Stop(time.Minute)
		distinct, dups, last := w.count.stats(tag)
		t.Logf("run %d: stopped after %d deliveries; %d delivered, %d duplicates, recovered in %s",
			run, at, distinct, dups, last.Sub(stopped).Round(time.Millisecond))
		o.Runs++
		o.Committed += drainEvents
		o.Delivered += distinct
		o.Lost += drainEvents - distinct
		o.Duplicated += dups
		o.Recovery = append(o.Recovery, last.Sub(stopped))
	}
	record(o)
	require.Zero(t, o.Lost)
	require.Zero(t, o.Duplicated, "a graceful stop must not cause duplicates")
}
