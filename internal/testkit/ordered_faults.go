package testkit

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
)

// OrderedFaultsArgs are the relay flags of the ordered kill-and-fault
// scenario: ordered mode and four workers; a short lease, so that a killed
// relay's claims come back within seconds, with a confirm deadline that
// relays built with the race detector meet on a loaded two-core machine
// (at 1.5 s they missed it often and published whole batches again);
// short retries, so that a failing head backs off for at most half a
// second; and attempts without end, since under the default block policy
// a dead-lettered head would stop its aggregate for good.
var OrderedFaultsArgs = []string{"--ordering=aggregate", "--workers=4",
	"--lease=5s", "--confirm-timeout=4s", "--poll-interval=200ms",
	"--retry-min=50ms", "--retry-max=500ms", "--max-attempts=1000000"}

// The aggregate classes of the ordered kill-and-fault scenario, written as
// the events' aggregate_type.
const (
	// ClassPlain aggregates are not failed on purpose.
	ClassPlain = "plain"
	// ClassLate aggregates' events name a per-row exchange that does not
	// exist at first (the relay fails them with "exchange not found"), then
	// exists with no binding (RabbitMQ returns them: every publish is
	// mandatory), and is finally bound to the relays' exchange.
	ClassLate = "late"
	// ClassFull aggregates' events are routed (routing key full.<tag>) to a
	// queue that holds at most FullQueueLength messages and rejects
	// publishes when full (x-overflow reject-publish), so RabbitMQ nacks
	// them; once an event has been nacked (Run awaits it), the queue is
	// purged at random moments, so that it rejects some more now and then.
	// A nacked event is still delivered to the other queues it was routed
	// to, the consumer's among them, so every nack of a full aggregate's
	// event is also a duplicate.
	ClassFull = "full"
)

// FullQueueLength is how many messages the rejecting queue of ClassFull
// holds.
const FullQueueLength = 25

// OrderedFaults is the kill-and-fault scenario of ordered mode, which the
// main suite and the fault suite both run: relays in ordered mode drain a
// backlog of many aggregates while producers commit more events to every
// aggregate, and meanwhile RabbitMQ refuses some aggregates' events (a
// missing exchange, returns, nacks), every relay's connection is cut for a
// moment, and one relay is killed with SIGKILL. Each fault strikes once the
// consumer has received a random share of the backlog.
//
// Every event's payload holds "seq", its place in its aggregate (1, 2, …;
// each aggregate is written by one producer at a time, so id order is seq
// order) and "n", its place in the run, in commit order (roughly, for the
// events the producers commit concurrently). The consumer is the caller's:
// it feeds Tally, which OrderedRun.Check holds against the table.
type OrderedFaults struct {
	// Pool is on the outbox database; Exchange is the relays' exchange.
	Pool     *pgxpool.Pool
	Exchange string
	// Tag is the event_type of every event of the run.
	Tag string
	// Tally is fed by the caller's consumer; how many distinct events it
	// has seen is the run's progress, which the faults and the producers
	// await.
	Tally *OrderTally
	// Rand makes every random choice: the aggregates' classes, where each
	// fault strikes, how long the cut lasts, which relay dies, when the
	// full queue is purged.
	Rand *rand.Rand
	// Relay starts one relay process that reaches RabbitMQ at amqpURL (a
	// proxy), with args (OrderedFaultsArgs) added to the caller's own.
	Relay func(amqpURL string, args ...string) *Process
	// Logf reports what the scenario does, as it does it (t.Logf).
	Logf func(format string, args ...any)
	// Aggregates, default 1000; Backlog events each before the relays
	// start, default 20; More events each that producers commit while the
	// relays run, default 3; Relays, default 3.
	Aggregates, Backlog, More, Relays int
}

// OrderedRun is one run of OrderedFaults, from the moment its faults are
// over: the relays go on draining, the full queue goes on being purged.
type OrderedRun struct {
	// Relays are the relays still running.
	Relays []*Process
	// Committed is how many events the run committed, all of them by now.
	Committed int
	// Faults is how many faults struck: the nacks, the missing exchange,
	// the returns, the cut and the kill.
	Faults int
	// Ended is when the last fault ended (the exchange bound, the proxy
	// restored or the relay killed, whichever came last), and
	// CommittedByEnd how many events had been committed then.
	Ended          time.Time
	CommittedByEnd int
	// Steps describe each fault as it struck, for the test's log.
	Steps []string

	s       OrderedFaults
	started []*Process // every relay, the killed one too
	start   time.Time
	close   func()
}

func (s OrderedFaults) withDefaults() OrderedFaults {
	if s.Aggregates == 0 {
		s.Aggregates = 1000
	}
	if s.Backlog == 0 {
		s.Backlog = 20
	}
	if s.More == 0 {
		s.More = 3
	}
	if s.Relays == 0 {
		s.Relays = 3
	}
	if s.Logf == nil {
		s.Logf = func(string, ...any) {}
	}
	return s
}

// orderedProducers is how many producers commit the events written while
// the relays run; each writes its own aggregates.
const orderedProducers = 4

// Run inserts the backlog, starts the relays, the producers and the
// purging of the full queue, and strikes with every fault, each once the
// consumer has received a random share of the backlog. It returns once
// every fault is over and the producers are done. The full queue is purged
// until the test ends or Close.
func (s OrderedFaults) Run(t testing.TB) *OrderedRun {
	t.Helper()
	if s.Tally == nil || s.Rand == nil || s.Relay == nil {
		panic("testkit: OrderedFaults needs a Tally, a Rand and a Relay")
	}
	s = s.withDefaults()
	r := s.Rand
	run := &OrderedRun{s: s}
	late := UniqueName("outboxrelay_late")

	// One aggregate in twenty is late, one in twenty full.
	classes := make([]string, s.Aggregates)
	for i, k := range r.Perm(s.Aggregates) {
		switch {
		case i < s.Aggregates/20:
			classes[k] = ClassLate
		case i < s.Aggregates/10:
			classes[k] = ClassFull
		default:
			classes[k] = ClassPlain
		}
	}

	conn, ch := dialAMQP(t)
	full := run.declareFull(t, conn, ch)
	purged := make(chan struct{})
	stopPurging := make(chan struct{})
	purgeRand := rand.New(rand.NewPCG(r.Uint64(), r.Uint64()))
	var purging atomic.Bool
	startPurging := func() {
		purging.Store(true)
		go func() {
			defer close(purged)
			purgeFull(conn, full, purgeRand, stopPurging)
		}()
	}
	var once sync.Once
	run.close = func() {
		once.Do(func() {
			close(stopPurging)
			if purging.Load() {
				<-purged
			}
			conn.Close() // deletes the exclusive full queue
		})
	}
	t.Cleanup(run.close)

	// The backlog, seq-major: every aggregate's event 1, then every
	// aggregate's event 2, …, so that the ids of one aggregate's events are
	// far apart and unordered claims by several workers would mix them up.
	backlog := s.Aggregates * s.Backlog
	Exec(t, s.Pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, exchange)
		SELECT c.class, c.k::text, $1, jsonb_build_object('seq', s, 'n', (s - 1) * $3 + c.k),
			CASE WHEN c.class = 'late' THEN $4 END
		FROM generate_series(1, $2::int) AS s, unnest($5::text[]) WITH ORDINALITY AS c (class, k)
		ORDER BY s, c.k`, s.Tag, s.Backlog, s.Aggregates, late, classes)

	proxy, amqpURL := NewAMQPProxy(t)
	run.start = time.Now()
	for range s.Relays {
		p := s.Relay(amqpURL, OrderedFaultsArgs...)
		run.Relays = append(run.Relays, p)
		run.started = append(run.started, p)
	}
	// The faults strike once every relay has started. A relay that cannot
	// reach RabbitMQ at start-up exits (publish.Dial fails fast), so a cut
	// that caught one still starting, as on a machine loaded by the rest of
	// the suite, would end it rather than test its reconnection.
	for i, p := range run.Relays {
		WaitFor(t, time.Minute, fmt.Sprintf("%s: relay %d started", s.Tag, i), func() bool {
			select {
			case <-p.Done():
				t.Fatalf("testkit: %s: relay %d exited at start-up (%v):\n%s", s.Tag, i, p.Err(), p.Out.String())
			default:
			}
			return strings.Contains(p.Out.String(), "relay started")
		})
	}
	s.Logf("%s: %d relays started on a backlog of %d events of %d aggregates (%d late, %d full)",
		s.Tag, s.Relays, backlog, s.Aggregates, s.Aggregates/20, s.Aggregates/10-s.Aggregates/20)

	// The producers: round i writes event Backlog+i of every aggregate once
	// the consumer has received i/(More+1) of the backlog.
	quit := make(chan struct{})
	var next atomic.Int64
	next.Store(int64(backlog))
	var producers sync.WaitGroup
	for p := range orderedProducers {
		producers.Go(func() {
			for round := 1; round <= s.More; round++ {
				switch s.Tally.await(backlog*round/(s.More+1), 3*time.Minute, quit) {
				case errQuit: // Run failed the test already
					return
				case errTimeout:
					t.Errorf("%s: producer %d: the relays stalled before round %d", s.Tag, p, round)
					return
				}
				if err := s.produce(p, s.Backlog+round, classes, late, &next); err != nil {
					t.Errorf("%s: producer %d: %v", s.Tag, p, err)
					return
				}
			}
		})
	}
	// If Run fails the test before the producers are done, they stop.
	defer func() {
		close(quit)
		producers.Wait()
	}()

	type step struct {
		at   int
		name string
		do   func()
	}
	share := func(lo, hi float64) int { return int(float64(backlog) * (lo + r.Float64()*(hi-lo))) }
	declareAt := share(0.05, 0.25)
	bindAt := declareAt + share(0.05, 0.25)
	cutFor := 200*time.Millisecond + time.Duration(r.Int64N(int64(1300*time.Millisecond)))
	victim := r.IntN(s.Relays)
	steps := []step{
		// The full queue fills with the first full events and rejects the
		// next: a nack is awaited before the purging starts, so that every
		// run proves that nacked events are retried in order.
		{share(0, 0.05), "full queue rejecting, purged from then on", func() {
			run.awaitFailure(t, ClassFull, "nacked")
			startPurging()
		}},
		{declareAt, "late exchange declared, unbound", func() {
			run.awaitFailure(t, ClassLate, "exchange not found")
			if err := ch.ExchangeDeclare(late, "topic", true, false, false, false, nil); err != nil {
				t.Fatalf("testkit: declare exchange %s: %v", late, err)
			}
			t.Cleanup(func() { DeleteExchange(t, late) })
		}},
		{bindAt, "late exchange bound", func() {
			run.awaitFailure(t, ClassLate, "returned")
			if err := ch.ExchangeBind(s.Exchange, "#", late, false, nil); err != nil {
				t.Fatalf("testkit: bind exchange %s to %s: %v", late, s.Exchange, err)
			}
		}},
		{share(0.2, 0.7), fmt.Sprintf("relay %d killed (SIGKILL)", victim), func() {
			run.Relays[victim].Kill()
			run.Relays = slices.Delete(run.Relays, victim, victim+1)
		}},
		{share(0.1, 0.8), fmt.Sprintf("every relay's connection cut for %s", cutFor.Round(time.Millisecond)), func() {
			proxy.Cut()
			<-time.After(cutFor) // the fault's length
			proxy.Restore()
		}},
	}
	sort.SliceStable(steps, func(i, j int) bool { return steps[i].at < steps[j].at })
	for _, st := range steps {
		if s.Tally.await(st.at, 3*time.Minute, nil) != nil {
			t.Fatalf("%s: %d events delivered, %d awaited for: %s", s.Tag, s.Tally.Unique(), st.at, st.name)
		}
		st.do()
		run.Faults++
		line := fmt.Sprintf("%s at %d delivered, %s after the start", st.name, st.at, time.Since(run.start).Round(time.Millisecond))
		run.Steps = append(run.Steps, line)
		s.Logf("%s: %s", s.Tag, line)
	}
	run.Ended = time.Now()
	run.CommittedByEnd = int(QueryInt(t, s.Pool, `SELECT count(*) FROM outbox WHERE event_type = $1`, s.Tag))
	producers.Wait()
	if t.Failed() {
		t.FailNow()
	}
	run.Committed = int(QueryInt(t, s.Pool, `SELECT count(*) FROM outbox WHERE event_type = $1`, s.Tag))
	if want := s.Aggregates * (s.Backlog + s.More); run.Committed != want {
		t.Fatalf("%s: %d events committed, %d written", s.Tag, run.Committed, want)
	}
	return run
}

// produce commits event seq of producer p's aggregates (those whose
// number is p modulo orderedProducers), 50 to a transaction.
func (s OrderedFaults) produce(p, seq int, classes []string, late string, next *atomic.Int64) error {
	var (
		cs []string
		ks []int
	)
	for k := p; k < s.Aggregates; k += orderedProducers {
		cs, ks = append(cs, classes[k]), append(ks, k+1)
	}
	for len(ks) > 0 {
		m := min(50, len(ks))
		base := next.Add(int64(m)) - int64(m)
		ns := make([]int64, m)
		for i := range ns {
			ns[i] = base + int64(i) + 1
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := s.Pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, exchange)
			SELECT u.class, u.k::text, $1, jsonb_build_object('seq', $2::int, 'n', u.n),
				CASE WHEN u.class = 'late' THEN $3 END
			FROM unnest($4::text[], $5::int[], $6::bigint[]) AS u (class, k, n)
			ORDER BY u.n`, s.Tag, seq, late, cs[:m], ks[:m], ns)
		cancel()
		if err != nil {
			return fmt.Errorf("insert event %d: %w", seq, err)
		}
		cs, ks = cs[m:], ks[m:]
	}
	return nil
}

// declareFull declares the rejecting queue of ClassFull, exclusive to
// conn, bound to the relays' exchange for full.#.
func (run *OrderedRun) declareFull(t testing.TB, conn *amqp.Connection, ch *amqp.Channel) string {
	t.Helper()
	q, err := ch.QueueDeclare(UniqueName("outboxrelay_full"), false, true, true, false,
		amqp.Table{"x-max-length": int32(FullQueueLength), "x-overflow": "reject-publish"})
	if err != nil {
		conn.Close()
		t.Fatalf("testkit: declare the full queue: %v", err)
	}
	if err := ch.QueueBind(q.Name, ClassFull+".#", run.s.Exchange, false, nil); err != nil {
		conn.Close()
		t.Fatalf("testkit: bind the full queue: %v", err)
	}
	return q.Name
}

// purgeFull empties the full queue every 10 to 60 ms, at random, until
// stop is closed or the connection fails.
func purgeFull(conn *amqp.Connection, queue string, r *rand.Rand, stop <-chan struct{}) {
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	for {
		select {
		case <-stop:
			return
		case <-time.After(10*time.Millisecond + time.Duration(r.Int64N(int64(50*time.Millisecond)))):
		}
		if _, err := ch.QueuePurge(queue, false); err != nil {
			return
		}
	}
}

// awaitFailure waits until some event of class has failed with an error
// that contains text: proof that the fault struck.
func (run *OrderedRun) awaitFailure(t testing.TB, class, text string) {
	t.Helper()
	WaitFor(t, time.Minute, fmt.Sprintf("%s: a %s event failed with %q", run.s.Tag, class, text), func() bool {
		return QueryInt(t, run.s.Pool, `SELECT count(*) FROM (SELECT 1 FROM outbox
			WHERE event_type = $1 AND aggregate_type = $2 AND strpos(last_error, $3) > 0 LIMIT 1) AS f`,
			run.s.Tag, class, text) > 0
	})
}

// Warnings counts the relays' log lines at level WARN or above, by
// message, and any other line they printed: what the faults made the
// relays do.
func (run *OrderedRun) Warnings() map[string]int {
	counts := map[string]int{}
	for _, p := range run.started {
		for _, line := range strings.Split(p.Out.String(), "\n") {
			var entry struct{ Level, Msg string }
			switch {
			case strings.TrimSpace(line) == "":
			case json.Unmarshal([]byte(line), &entry) != nil:
				counts[line]++ // not a log entry: the relay's last words
			case entry.Level != "INFO" && entry.Level != "DEBUG":
				counts[entry.Msg]++
			}
		}
	}
	return counts
}

// Close stops purging the full queue and deletes it. The test's cleanup
// does it too.
func (run *OrderedRun) Close() { run.close() }
