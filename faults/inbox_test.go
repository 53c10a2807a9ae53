//go:build faults

package faults

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

const (
	// inboxEvents is how many events the relay delivers to the ledger.
	inboxEvents = 50000
	// inboxCopies is how many consumer processes share the queue.
	inboxCopies = 3
	// inboxName is the inbox's consumer name, which the copies share: a
	// copy of a message may go to any of them.
	inboxName = "ledger"
	// inboxAppName prefixes the application_name of every PostgreSQL
	// session of the consumers, whose backends the scenario terminates.
	inboxAppName = "inboxledger-"
)

// ledgerSchema is the consumers' ledger: one counter per event id, which
// their handler increments in the delivery's transaction (package
// faults/inboxconsumer); redelivered says whether the copy that applied
// the effect was a redelivery, applied_at when.
const ledgerSchema = `CREATE TABLE ledger (
	event_id    text        PRIMARY KEY,
	n           integer     NOT NULL,
	redelivered boolean     NOT NULL,
	applied_at  timestamptz NOT NULL DEFAULT clock_timestamp()
)`

// Scenario 15: the relay delivers 50,000 events to a queue consumed by
// three inbox consumer processes (faults/inboxconsumer), whose handler
// increments a ledger row per event id in the delivery's transaction.
// While they drain it, following a plan drawn from the seed: each
// consumer's AMQP connection is cut by its proxy every 0.3 to 1.2 s, with
// deliveries in flight, so that some of them had committed and not yet
// had their ack through; a consumer is SIGKILLed and started again every
// 1 to 3 s; the consumers' PostgreSQL backends are terminated every 1 to
// 3 s; and the relay is SIGKILLed twice mid-drain (with batches confirmed
// but not yet marked, republished once their lease lapses: the broker
// receives duplicates). The faults stop when all but 500 to 2,000 events
// are applied. At the end every event's counter is exactly 1, every
// committed event is in the ledger and nothing else is, the dead-letter
// queue is empty, and the duplicates the consumers dropped are reported.
func TestInboxLedgerUnderFaults(t *testing.T) {
	w := newWorld(t)
	r := rng(t)
	o := outcome{Scenario: "15 inbox: 3 consumers killed, cut off, their backends terminated; relay killed"}
	const tag = "ledger"
	bin := buildInboxConsumer(t)
	queue, dlq := inboxQueue(t, w.exchange)
	testkit.Exec(t, w.pool, ledgerSchema)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	require.NoError(t, inbox.Migrate(ctx, w.pool, ""))
	cancel()

	plan := drawInboxPlan(r, 3*time.Minute)
	relayKills := faultPoints(r, 2, 2000, inboxEvents*9/10)
	stopAt := inboxEvents - 500 - r.IntN(1500)
	t.Logf("plan: %s; the relay killed after %v events published; no fault once %d events are applied", plan, relayKills, stopAt)

	fleet := newInboxFleet(t, bin, w.url, queue)
	w.insert(tag, inboxEvents)
	relayArgs := append(slices.Clone(crashArgs), "--batch-size=500")
	fleet.relay = w.relay(relayArgs...)

	var (
		counts     inboxFaults
		lastFault  time.Time
		step       = 0
		started    = time.Now()
		next       = time.NewTimer(plan[0].at)
		poll       = time.NewTicker(100 * time.Millisecond)
		deadline   = time.NewTimer(3 * time.Minute)
		terminated int64
	)
	defer next.Stop()
	defer poll.Stop()
	defer deadline.Stop()
faults:
	for {
		select {
		case <-next.C:
			f := plan[step]
			switch f.kind {
			case inboxKill:
				fleet.kill(f.target)
				counts.kills++
			case inboxCut:
				fleet.proxies[f.target].Cut()
				counts.cuts++
			case inboxRestore:
				fleet.proxies[f.target].Restore()
			case inboxTerminate:
				terminated += testkit.QueryInt(t, w.pool, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
					WHERE datname = current_database() AND application_name LIKE $1`, inboxAppName+"%")
				counts.terminations++
			}
			lastFault = time.Now()
			if step++; step == len(plan) {
				break faults // not expected: the plan lasts as long as the deadline
			}
			next.Reset(max(0, plan[step].at-time.Since(started)))
		case <-poll.C:
			fleet.checkRunning()
			if len(relayKills) > 0 && w.published(tag) >= relayKills[0] {
				fleet.relay.Kill()
				fleet.relay = w.relay(relayArgs...)
				t.Logf("relay killed after %d events published", relayKills[0])
				relayKills = relayKills[1:]
				counts.relayKills++
				lastFault = time.Now()
			}
			if len(relayKills) == 0 && ledgerRows(t, w) >= stopAt {
				break faults
			}
		case <-deadline.C:
			t.Fatalf("%d of %d events applied within 3 minutes of faults", ledgerRows(t, w), inboxEvents)
		}
	}
	// A cut still in force is repaired, and is the last fault.
	for _, p := range fleet.proxies {
		if p.cut {
			p.Restore()
			lastFault = time.Now()
		}
	}
	t.Logf("faults over after %s: %d events applied", time.Since(started).Round(time.Millisecond), ledgerRows(t, w))

	// Every event is marked published, so the relay publishes no more
	// copies; the tap (the world's counting consumer) has them all.
	fleet.await(time.Minute, "every event published", func() bool { return w.published(tag) >= inboxEvents })
	committed := w.committed(tag)
	require.True(t, w.count.awaitDistinct(tag, committed, time.Minute), "the tap queue did not receive every event")
	_, relayDuplicates := w.count.stats(tag)
	// The ledger fills up, and no copy is left in the queue, ready or
	// unacked: every delivery was acked (or dead-lettered).
	fleet.await(time.Minute, "every committed event in the ledger", func() bool { return ledgerRows(t, w) >= committed })
	fleet.await(time.Minute, "the queue to be empty", func() bool { return queueReady(t, queue) == 0 })
	fleet.await(time.Minute, "no delivery left unacked", func() bool { return queueMessages(t, queue) == 0 })
	totals := fleet.stop()
	require.Zero(t, queueReady(t, queue), "copies left in the queue after the consumers stopped")
	fleet.relay.Stop(time.Minute)
	t.Logf("the consumers' warnings and errors: %s", fleet.logSummary())

	var rows, twice, redelivered int
	var last time.Time
	require.NoError(t, w.pool.QueryRow(context.Background(), `SELECT count(*), coalesce(sum(n - 1), 0),
		count(*) FILTER (WHERE redelivered), coalesce(max(applied_at), now()) FROM ledger`).Scan(&rows, &twice, &redelivered, &last))
	matched := int(testkit.QueryInt(t, w.pool, `SELECT count(*) FROM outbox o JOIN ledger l ON l.event_id = o.event_id::text
		WHERE o.event_type = $1`, tag))
	strays := testkit.QueryInt(t, w.pool, `SELECT count(*) FROM ledger l
		WHERE NOT EXISTS (SELECT FROM outbox o WHERE o.event_id::text = l.event_id)`)
	var recorded, unprocessed, failedAttempts int
	require.NoError(t, w.pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE processed_at IS NOT NULL),
		count(*) FILTER (WHERE processed_at IS NULL), coalesce(sum(attempts), 0) FROM inbox WHERE consumer = $1`,
		inboxName).Scan(&recorded, &unprocessed, &failedAttempts))
	deadLettered := queueReady(t, dlq)
	recovery := max(0, last.Sub(lastFault))

	o.Faults = counts.total()
	o.Committed = committed
	o.Delivered = rows
	o.Lost = committed - matched
	o.Duplicated = int(totals.duplicates)
	o.DeadLettered = deadLettered
	o.Recovery = []time.Duration{recovery}
	o.Notes = []string{
		fmt.Sprintf("faults: %d consumer SIGKILLs, %d AMQP cuts, %d backend terminations (%d backends), %d relay SIGKILLs; none once %d of %d events were applied",
			counts.kills, counts.cuts, counts.terminations, terminated, counts.relayKills, stopAt, inboxEvents),
		fmt.Sprintf("effects applied twice: %d; messages recorded processed in the inbox: %d; events applied from a copy RabbitMQ redelivered: %d",
			twice, recorded, redelivered),
		fmt.Sprintf("duplicates the consumers dropped: %d (inbox_duplicates_total, each killed process scraped just before its SIGKILL); copies the relay published twice (a tap queue counted them): %d; the rest are RabbitMQ's redeliveries of deliveries committed and not acked",
			int(totals.duplicates), relayDuplicates),
		fmt.Sprintf("inbox_processed_total summed to %d of the %d commits: the scrapes before the kills missed %d increments (the duplicates count misses about as few)",
			int(totals.processed), recorded, recorded-int(totals.processed)),
		fmt.Sprintf("handler attempts failed: %d (inbox_retried_total), %d recorded in the inbox table; attempts the database failed, retried uncounted: %d (inbox_database_failures_total); dead-lettered: %d (inbox_dead_lettered_total), %d in the dead-letter queue",
			int(totals.retried), failedAttempts, int(totals.dbFailures), int(totals.dead), deadLettered),
		"recovery: from the last fault to the last event applied",
	}
	record(o)
	t.Logf("%d committed, %d applied (%d matching the outbox), %d applied twice; %d duplicates dropped by the consumers (%d published twice by the relay); %d processed, %d retried, %d dead-lettered (metrics); last event applied %s after the last fault",
		committed, rows, matched, twice, int(totals.duplicates), relayDuplicates, int(totals.processed), int(totals.retried), int(totals.dead), recovery.Round(time.Millisecond))

	require.Zero(t, twice, "an event's effect was applied more than once")
	require.Equal(t, committed, rows, "ledger rows")
	require.Equal(t, committed, matched, "committed events in the ledger")
	require.Zero(t, strays, "ledger rows of no committed event")
	require.Equal(t, committed, recorded, "inbox records of processed messages")
	require.Zero(t, unprocessed, "inbox records of messages never processed")
	require.Zero(t, deadLettered, "messages in the dead-letter queue")
	require.Zero(t, totals.dead, "deliveries dead-lettered")
	require.LessOrEqual(t, int(totals.processed), committed, "inbox_processed_total counts more commits than events")
	if counts.cuts > 0 && relayDuplicates == 0 && totals.duplicates == 0 {
		t.Errorf("%d cuts and %d kills, and no consumer saw a duplicate: the faults missed their mark", counts.cuts, counts.kills)
	}
}
