//go:build faults

package faults

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// orderedRuns is how many times scenario 11 is played.
const orderedRuns = 3

// Scenario 11: ordered mode under a kill and broker faults
// (testkit.OrderedFaults, the scenario of the main suite's
// TestOrderedKillAndBrokerFaults). Three relays of four workers in ordered
// mode drain 1,000 aggregates × 20 events while producers commit 3 more
// per aggregate; one aggregate in twenty names a per-row exchange that is
// missing, then unbound (returned), then bound; one in twenty is also
// routed to a full queue that rejects publishes (nacks) and is purged at
// random moments; every relay's connection is cut for 0.2 to 1.5 s; one
// relay is killed with SIGKILL; each fault strikes once a random share of
// the backlog is delivered. The counting consumer checks that within every
// aggregate each first arrival follows its predecessors'. Three times,
// each in a fresh outbox; the outcome is recorded before it is judged.
func TestOrderedKillAndBrokerFaults(t *testing.T) {
	r := rng(t)
	o := outcome{Scenario: "11 ordered mode: a relay killed, connections cut, returns and nacks"}
	var problems []string
	for run := range orderedRuns {
		w := newWorld(t)
		orderingIndex(t, w.url)
		tag := fmt.Sprintf("ordered-%d", run)
		tally := w.count.checkOrder(tag)
		started := time.Now()
		res := testkit.OrderedFaults{
			Pool: w.pool, Exchange: w.exchange, Tag: tag, Tally: tally, Rand: r,
			Relay: func(amqpURL string, args ...string) *testkit.Process { return w.relayVia(amqpURL, args...) },
			Logf:  t.Logf,
		}.Run(t)
		o.Faults += res.Faults
		w.settle(&o, tag, res.Committed, faultEnd{at: res.Ended, committed: res.CommittedByEnd})
		took := time.Since(started)
		for _, p := range res.Relays {
			p.Stop(time.Minute)
		}
		res.Close()
		f := res.Check(t, tally)
		t.Logf("%s: %s", tag, f)
		t.Logf("%s: the relays' warnings: %v", tag, res.Warnings())
		if len(f.Violations) > 0 {
			problems = append(problems, fmt.Sprintf("%s: %d first arrivals out of order or events missing: %s", tag, len(f.Violations), f.FirstViolations(20)))
		}
		if n := testkit.QueryInt(t, w.pool, `SELECT count(*) FROM outbox WHERE status = 'failed'`); n > 0 {
			problems = append(problems, fmt.Sprintf("%s: %d events dead-lettered", tag, n))
		}
		o.Notes = append(o.Notes, fmt.Sprintf("run %d, all delivered %s after the run started: %s; %d order violations; "+
			"duplicates by class: plain %d, late %d, full %d; events whose last failure was a nack %d, a return %d, a missing exchange %d, anything else (the cut, confirm timeouts) %d",
			run, took.Round(100*time.Millisecond), strings.Join(res.Steps, "; "), len(f.Violations),
			f.ByClass[testkit.ClassPlain].Duplicates, f.ByClass[testkit.ClassLate].Duplicates, f.ByClass[testkit.ClassFull].Duplicates,
			f.LastErrors["nacked"], f.LastErrors["returned"], f.LastErrors["exchange not found"], f.LastErrors["other"]))
	}
	record(o)
	require.Zero(t, o.Lost)
	require.Empty(t, problems)
}

// orderingIndex creates the index ordered mode needs on the world's outbox,
// which the relays, run with --no-migrate, do not.
func orderingIndex(t *testing.T, url string) {
	t.Helper()
	testkit.InstallOrdering(t, url)
}
