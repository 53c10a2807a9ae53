package main_test

import (
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// TestOrderedKillAndBrokerFaults is ordered mode's acceptance test: three
// relays of four workers each, in ordered mode, drain a backlog of 1,000
// aggregates × 20 events while producers commit 3 more to every aggregate;
// meanwhile one aggregate in twenty names a per-row exchange that is
// missing, then unbound (returned), then bound; one in twenty is also
// routed to a full queue that rejects publishes (nacks); every relay's
// broker connection is cut for up to 1.5 s; and one relay is killed with
// SIGKILL (testkit.OrderedFaults). The relays create the ordering index
// themselves (--migrate). A consumer checks that within every aggregate
// each event's first arrival follows its predecessors', and that every
// committed event arrives; duplicates are counted and logged, not
// forbidden. Every random choice comes from a seed the test logs;
// ORDERED_FAULTS_SEED replays it.
func TestOrderedKillAndBrokerFaults(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("ORDERED_FAULTS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "ORDERED_FAULTS_SEED")
		seed = v
	}
	t.Logf("seed %d (replay with ORDERED_FAULTS_SEED=%d)", seed, seed)
	dbURL, pool := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)

	// The consumer runs until told to stop, then the test drains the
	// queue up to a barrier.
	queue := testkit.NewQueue(t, exchange, "#")
	tally := testkit.NewOrderTally()
	stopConsuming, consumed := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(consumed)
		for {
			select {
			case d, ok := <-queue.Deliveries:
				if !ok {
					return
				}
				tally.Add(d)
			case <-stopConsuming:
				return
			}
		}
	}()
	stop := sync.OnceFunc(func() {
		close(stopConsuming)
		<-consumed
	})
	t.Cleanup(stop)

	started := time.Now()
	run := testkit.OrderedFaults{
		Pool: pool, Exchange: exchange, Tag: "ordered", Tally: tally, Rand: rand.New(rand.NewPCG(seed, 0)),
		Relay: func(amqpURL string, args ...string) *testkit.Process {
			return startRelay(t, relayEnv(dbURL, exchange, "AMQP_URL="+amqpURL), args...)
		},
		Logf: t.Logf,
	}.Run(t)
	faultsOver := time.Since(started)

	if !tally.Await(run.Committed, 2*time.Minute) {
		t.Fatalf("%d of %d events arrived within 2 minutes of the last fault; %s",
			tally.Unique(), run.Committed, run.Check(t, tally))
	}
	arrived := time.Since(started)
	testkit.WaitFor(t, time.Minute, "every event marked published", func() bool {
		return testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE status = 'published'`) == int64(run.Committed)
	})
	for _, r := range run.Relays {
		r.Stop(time.Minute)
	}
	// Whatever the relays published twice before they stopped is in the
	// queue by now: read it up to a barrier.
	stopped := time.Since(started)
	stop()
	tally.Add(queue.Drain(t, 30*time.Second)...)

	f := run.Check(t, tally)
	t.Logf("faults over after %s, every event delivered after %s, relays stopped after %s: %s",
		faultsOver.Round(time.Millisecond), arrived.Round(time.Millisecond), stopped.Round(time.Millisecond), f)
	t.Logf("the relays' warnings: %v", run.Warnings())
	require.Zero(t, len(f.Violations), "first arrivals out of order, or events missing: %s", f.FirstViolations(20))
	require.Zero(t, f.Lost)
	require.Zero(t, testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE status = 'failed'`), "nothing may be dead-lettered")
}
