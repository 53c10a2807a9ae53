//go:build faults

package faults

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// The scenarios of a takeover (16 and 17): a fault strikes relays that hold
// claims they have not settled, with the lease at its default 30 s, and
// the rows of those claims must be published by a live relay soon after
// the fault ends. Each run drains a backlog of takeoverBacklog events
// while a producer adds takeoverRate more a second, and the fault strikes
// once the backlog is drained and the relays keep pace with the producer.
// The events held when the fault struck must arrive within takeoverBound
// of its end, and so, but for scenario 17b, must every event committed by
// then.
const (
	takeoverBacklog = 20000
	takeoverRate    = 500
	// takeoverAggregates spread the events, so that ordered claims have
	// aggregates enough to keep four workers busy.
	takeoverAggregates = 1000
	takeoverRuns       = 2
	// takeoverBound is the issue's: 2 s for the rows to be claimable
	// again, and 1 s to publish them and what came meanwhile.
	takeoverBound = 3 * time.Second
	// stuckAfter is how long a claim must have stayed unsettled to be
	// taken for one its relay cannot publish: a relay that can settles a
	// batch of the producer's events in milliseconds.
	stuckAfter = time.Second
)

// takeoverArgs leave every setting at its default; the lease is named to
// say that it stays at 30 s.
var takeoverArgs = []string{"--lease=30s"}

// takeoverRun is one run of a takeover scenario.
type takeoverRun struct {
	t       *testing.T
	w       *world
	tag     string
	args    []string
	ordered *testkit.OrderTally // the order of first arrivals, in ordered mode
	stream  *takeoverStream
}

// startTakeover prepares a run on w: the backlog committed, the producer
// not yet started; in ordered mode the relays' flag, and the counter
// checking the order.
func startTakeover(t *testing.T, w *world, tag string, ordered bool, args ...string) *takeoverRun {
	t.Helper()
	run := &takeoverRun{t: t, w: w, tag: tag, args: append(slices.Clone(takeoverArgs), args...)}
	if ordered {
		run.args = append(run.args, "--ordering=aggregate")
		run.ordered = w.count.checkOrder(tag)
	}
	run.stream = &takeoverStream{w: w, tag: tag, next: 1}
	run.stream.commit(t, takeoverBacklog)
	return run
}

// takeoverStream commits events of one type numbered 1, 2, … in commit
// order ("n"), spread over takeoverAggregates aggregates of type order,
// each aggregate's events numbered in its own order ("seq"), so that the
// counter can check both the arrivals and, in ordered mode, their order.
type takeoverStream struct {
	w   *world
	tag string
	// mu is held while events are numbered and committed: by the producer
	// for each of its commits, by a fault for a commit of its own.
	mu   sync.Mutex
	next int // the number of the next event
	stop chan struct{}
	done chan struct{}
	halt func() int // stops the producer; see run
}

// querier runs a statement: the world's pool, or a transaction.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// commit commits events next … next+n-1 in one statement, in that order.
func (s *takeoverStream) commit(t *testing.T, n int) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	require.NoError(t, s.insert(s.w.pool, n))
	s.next += n
}

// insert inserts events next … next+n-1 through q; the caller moves next
// once they are committed.
func (s *takeoverStream) insert(q querier, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := q.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', ((i - 1) % $4)::text, $1, jsonb_build_object('n', i, 'seq', (i - 1) / $4 + 1)
		FROM generate_series($2::int, $3::int) AS i ORDER BY i`, s.tag, s.next, s.next+n-1, takeoverAggregates)
	return err
}

// run commits takeoverRate events a second, 5 every 10 ms, until halt,
// which returns how many events were committed in all; the test's end
// halts it too.
func (s *takeoverStream) run() {
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	var once sync.Once
	s.halt = func() int {
		once.Do(func() {
			close(s.stop)
			<-s.done
		})
		return s.next - 1
	}
	s.w.t.Cleanup(func() { s.halt() })
	go func() {
		defer close(s.done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
			s.mu.Lock()
			const n = takeoverRate / 100
			if s.insert(s.w.pool, n) == nil { // else retried at the next tick: an event counts once committed
				s.next += n
			}
			s.mu.Unlock()
		}
	}()
}

// drained waits until the relays have published the backlog and keep pace
// with the producer: at most a tenth of a second's events pending.
func (run *takeoverRun) drained() {
	run.t.Helper()
	run.w.waitPublished(run.tag, takeoverBacklog, 3*time.Minute)
	testkit.WaitFor(run.t, time.Minute, run.tag+": the relays keeping pace", func() bool {
		return testkit.QueryInt(run.t, run.w.pool, `SELECT count(*) FROM outbox WHERE event_type = $1 AND status = 'pending'`,
			run.tag) <= takeoverRate/10
	})
}

// finish lets the producer go on through the takeover, stops it, and
// waits for every event: it adds the run to o with its recovery from
// end, and checks the order of first arrivals in ordered mode. It returns
// the recovery, and the takeover: from end until the last of the events
// held arrived (the rows the fault left leased, by claims no relay would
// settle before their lease).
func (run *takeoverRun) finish(o *outcome, end faultEnd, held []int, relays []*testkit.Process) (recovery, takeover time.Duration) {
	t := run.t
	t.Helper()
	<-time.After(takeoverBound) // the producer streams on through the takeover
	total := run.stream.halt()
	run.w.settle(o, run.tag, total, end)
	for _, p := range relays {
		p.Stop(time.Minute)
		require.NotContains(t, strings.ToLower(p.Out.String()), "panic")
	}
	if run.ordered != nil {
		require.Empty(t, run.ordered.Violations(), "%s: first arrivals out of order", run.tag)
	}
	last, ok := run.w.count.lastArrival(run.tag, held)
	require.True(t, ok, "%s: events held at the fault never arrived", run.tag)
	takeover = max(0, last.Sub(end.at))
	t.Logf("%s: the %d events held at the fault all arrived %s after its end", run.tag, len(held), takeover.Round(time.Millisecond))
	o.Notes = append(o.Notes, fmt.Sprintf("%s: %d events held, all arrived %s after the fault's end, everything committed by then %s after it",
		run.tag, len(held), takeover.Round(time.Millisecond), o.Recovery[len(o.Recovery)-1].Round(time.Millisecond)))
	return o.Recovery[len(o.Recovery)-1], takeover
}

// awaitStuck waits until the table shows rows of tag leased stuckAfter ago
// or earlier, still leased: claims whose relay cannot settle them. It
// returns those rows with their leases, and the numbers ("n") of their
// events that have not arrived. It waits up to heldWait for such a claim
// with events that have not arrived, the takeover's measure; but when the
// broker went silent after the messages of every batch in flight had
// reached it, only their confirms are lost, and no claim follows until
// the connection is found dead (workers with a batch in flight claim
// again only then), so after heldWait it takes stuck claims whose events
// all arrived (held is then empty). It fails the test at once if a
// process of watch exits.
func (w *world) awaitStuck(tag string, watch ...*testkit.Process) (map[int64]string, []int) {
	w.t.Helper()
	var (
		leases map[int64]string
		held   []int
	)
	const heldWait = 5 * time.Second
	began := time.Now()
	testkit.WaitFor(w.t, 30*time.Second, tag+": a claim its relay cannot publish", func() bool {
		for _, p := range watch {
			select {
			case <-p.Done():
				w.t.Fatalf("%s: a relay exited (%v):\n%s", tag, p.Err(), p.Out.String())
			default:
			}
		}
		// The lease runs 30 s from the claim.
		all := w.leases(tag, `available_at <= now() + interval '30 s' - $2 * interval '1 millisecond'`, stuckAfter.Milliseconds())
		leases, held = map[int64]string{}, nil
		for _, r := range all {
			leases[r.id] = r.lease
			if len(w.count.missing(tag, []int{r.n})) > 0 {
				held = append(held, r.n)
			}
		}
		return len(held) > 0 || len(all) > 0 && time.Since(began) > heldWait
	})
	return leases, held
}

// leasedRow is a leased row of the outbox, with its event's number.
type leasedRow struct {
	id    int64
	lease string
	n     int
}

// leases returns the rows of tag leased and not due that also meet where
// (a constant of this file, whose parameters from $2 on are args).
func (w *world) leases(tag, where string, args ...any) []leasedRow {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := w.pool.Query(ctx, `SELECT id, lease_id::text, (payload->>'n')::int FROM outbox
		WHERE event_type = $1 AND status = 'pending' AND lease_id IS NOT NULL AND available_at > now() AND `+where,
		append([]any{tag}, args...)...)
	require.NoError(w.t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (l leasedRow, err error) {
		return l, r.Scan(&l.id, &l.lease, &l.n)
	})
	require.NoError(w.t, err)
	return out
}

// killAndRestart plays a takeover after SIGKILL. The victim, a relay that
// reaches RabbitMQ through a proxy, drains the backlog alone; then the
// proxy goes silent, so that what the victim has in flight or claims from
// then on stays unpublished, and once a claim has stayed so for
// stuckAfter the other relays - 1 relays start. The victim lives on for keepFor, its claims
// stuck: none of them may pass to the others meanwhile. Then it is killed
// with SIGKILL and a new relay started at once in its place. Every event
// committed by the kill must arrive within takeoverBound of it.
func killAndRestart(t *testing.T, scenario string, relays int, ordered bool) {
	w := newWorld(t)
	if ordered {
		orderingIndex(t, w.url)
	}
	o := outcome{Scenario: scenario}
	for i := range takeoverRuns {
		run := startTakeover(t, w, fmt.Sprintf("takeover-kill-%d", i), ordered)
		broker, viaProxy := testkit.NewAMQPProxy(t)
		victim := w.relayVia(viaProxy, run.args...)
		run.stream.run()
		run.drained()
		broker.Blackhole()
		silent := time.Now()
		stuck, held := w.awaitStuck(run.tag, victim)
		ps := []*testkit.Process{victim}
		for range relays - 1 {
			ps = append(ps, w.relay(run.args...))
		}
		if relays > 1 {
			// The victim is alive, only stuck: the others, watching its
			// rows from their first advance, leave them to it.
			<-time.After(keepFor)
			kept := map[int64]string{}
			for _, r := range w.leases(run.tag, "true") {
				kept[r.id] = r.lease
			}
			for id, lease := range stuck {
				require.Equal(t, lease, kept[id], "%s: row %d of a live relay's claim passed to another", run.tag, id)
			}
		}
		victim.Kill()
		killed := time.Now()
		end := w.ended(run.tag)
		end.at = killed
		ps[0] = w.relay(run.args...)
		o.Faults++
		t.Logf("%s: the victim killed %s after its broker went silent, holding %d rows it had not settled, %d of whose events had not arrived; %d relays left",
			run.tag, killed.Sub(silent).Round(time.Millisecond), len(stuck), len(held), relays-1)
		recovery, takeover := run.finish(&o, end, held, ps)
		require.LessOrEqual(t, takeover, takeoverBound, "%s: the events the victim held arrived %s after the kill", run.tag, takeover)
		require.LessOrEqual(t, recovery, takeoverBound, "%s: the events committed by the kill arrived %s after it", run.tag, recovery)
	}
	record(o)
	require.Zero(t, o.Lost)
}

// keepFor is how long a stuck relay lives beside the others before it is
// killed: two of their rescue rounds.
const keepFor = 2 * time.Second

// Scenario 16: a relay killed with SIGKILL holding claims it has not
// published, and started again at once: the new relay takes them over.
func TestKilledRelaysClaimsTakenOver(t *testing.T) {
	killAndRestart(t, "16 SIGKILL, restarted at once: its claims taken over", 1, false)
}

// Scenario 16b: one of three relays killed with SIGKILL holding claims it
// has not published: the two others, which left them to it while it
// lived, take them over (a new one is started in its place).
func TestKilledRelaysClaimsTakenOverByTheOthers(t *testing.T) {
	killAndRestart(t, "16b one of three killed: its claims taken over", 3, false)
}

// Scenario 16c: scenario 16 in ordered mode: the heads the dead relay held
// are taken over with no first arrival out of order.
func TestKilledRelaysClaimsTakenOverInOrder(t *testing.T) {
	killAndRestart(t, "16c SIGKILL, restarted at once, ordered mode", 1, true)
}

// Scenario 16d: scenario 16b in ordered mode.
func TestKilledRelaysClaimsTakenOverByTheOthersInOrder(t *testing.T) {
	killAndRestart(t, "16d one of three killed, ordered mode", 3, true)
}

// partitionArgs keep the relay claiming every 2 ms while the producer
// streams (its gate closed above 200 events/s), so that a claim is sent
// as soon as the partition's claim can be.
var partitionArgs = []string{"--busy-rate=200"}

// partitionDuringClaim plays a silent partition between a relay and
// PostgreSQL (a proxy that forwards nothing and closes nothing) that
// strikes while claims are in flight. To have claims in flight when it
// strikes, the test holds them on the server: it locks the table (SHARE
// mode: the relay's claims and marks wait, its reads do not) in a
// transaction that commits a burst of events, and once a claim (or the
// mark a claim follows in one round trip) waits on the lock, the link
// stops forwarding what the server sends and the transaction commits. The
// claims waiting then run, take rows and commit, and their replies are
// lost (the run waits until the sessions that waited have run their
// statements, a claim among them); then the link stops forwarding what the relay sends too, for 10
// to 15 s from then. The events leased when the partition began must
// arrive within takeoverBound of its end, and, in unordered mode, so must
// every event committed by then.
func partitionDuringClaim(t *testing.T, scenario string, ordered bool) {
	w := newWorld(t)
	if ordered {
		orderingIndex(t, w.url)
	}
	r := rng(t)
	o := outcome{Scenario: scenario}
	u, err := url.Parse(w.url)
	require.NoError(t, err)
	for i := range takeoverRuns {
		run := startTakeover(t, w, fmt.Sprintf("takeover-partition-%d", i), ordered, partitionArgs...)
		proxy := testkit.NewProxy(t, u.Host)
		via := *u
		via.Host = proxy.Addr()
		p := w.relayThrough(via.String(), testkit.AMQPURL(), run.args...)
		run.stream.run()
		run.drained()
		d := 10*time.Second + time.Duration(r.Int64N(int64(5*time.Second)))
		w.claimInFlight(run, p, proxy)
		over := time.After(d)
		proxy.Blackhole()
		var held []int
		for _, r := range w.leases(run.tag, "true") {
			held = append(held, r.n)
		}
		require.NotEmpty(t, held, "%s: no claim held rows when the partition began", run.tag)
		<-over // the partition's length
		proxy.Heal()
		healed := time.Now()
		end := w.ended(run.tag)
		end.at = healed
		o.Faults++
		t.Logf("%s: partition for %s; %d rows leased when it began, by claims whose replies were lost among others", run.tag, d.Round(time.Millisecond), len(held))
		recovery, takeover := run.finish(&o, end, held, []*testkit.Process{p})
		require.LessOrEqual(t, takeover, takeoverBound, "%s: the events held when the partition began arrived %s after its end", run.tag, takeover)
		if !ordered {
			// In ordered mode the events committed during the partition
			// (5,000 to 7,500) take a loaded two-core machine up to 3 s
			// to publish once it ends, one event per aggregate at a time.
			require.LessOrEqual(t, recovery, takeoverBound, "%s: the events committed by the end of the partition arrived %s after it", run.tag, recovery)
		}
	}
	record(o)
	require.Zero(t, o.Lost)
}

// burstEvents is how many events the transaction that holds the claims
// commits: rows for the claims it held.
const burstEvents = 2000

// claimInFlight makes the relay p lose the replies of claims that commit:
// see partitionDuringClaim. It fails the test at once if the relay exits.
func (w *world) claimInFlight(run *takeoverRun, p *testkit.Process, proxy *testkit.Proxy) {
	w.t.Helper()
	ctx := context.Background()
	s := run.stream
	s.mu.Lock() // the producer waits: the burst's events come next
	defer s.mu.Unlock()
	tx, err := w.pool.Begin(ctx)
	require.NoError(w.t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `LOCK TABLE outbox IN SHARE MODE`)
	require.NoError(w.t, err)
	require.NoError(w.t, s.insert(tx, burstEvents))
	alive := func() {
		select {
		case <-p.Done():
			w.t.Fatalf("%s: the relay exited (%v):\n%s", run.tag, p.Err(), p.Out.String())
		default:
		}
	}
	// The relay's sessions waiting on the lock with a claim, or with the
	// mark that a claim follows in one round trip.
	var waiting []int32
	testkit.WaitFor(w.t, 15*time.Second, run.tag+": a claim waiting on the table's lock", func() bool {
		alive()
		rows, err := w.pool.Query(ctx, `SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'outboxrelay' AND wait_event_type = 'Lock'
			  AND (query LIKE '-- $1 batch size%' OR query LIKE '-- $1 ids. Any confirmed publish counts%')`)
		require.NoError(w.t, err)
		waiting, err = pgx.CollectRows(rows, pgx.RowTo[int32])
		require.NoError(w.t, err)
		return len(waiting) > 0
	})
	proxy.LoseReplies()
	require.NoError(w.t, tx.Commit(ctx))
	s.next += burstEvents
	// They have all run their statements since, one of them a claim: its
	// reply is lost.
	testkit.WaitFor(w.t, 15*time.Second, run.tag+": a claim whose reply is lost", func() bool {
		alive()
		return testkit.QueryInt(w.t, w.pool, `SELECT count(*) FILTER (WHERE state = 'idle' AND query LIKE '-- $1 batch size%')
				* (count(*) FILTER (WHERE state = 'active') = 0)::int
			FROM pg_stat_activity WHERE pid = ANY ($1)`, waiting) > 0
	})
}

// Scenario 17: a silent partition between the relay and PostgreSQL while
// claims are in flight, 10 to 15 s; the relay releases the claims whose
// replies it lost once the database answers again.
func TestClaimsWhoseRepliesWereLostAreReleased(t *testing.T) {
	partitionDuringClaim(t, "17 PostgreSQL partitioned during a claim", false)
}

// Scenario 17b: scenario 17 in ordered mode.
func TestClaimsWhoseRepliesWereLostAreReleasedInOrder(t *testing.T) {
	partitionDuringClaim(t, "17b PostgreSQL partitioned during a claim, ordered mode", true)
}
