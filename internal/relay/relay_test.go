package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/relay"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/notify"
	"github.com/outboxrelay/outboxrelay/publish"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testkit.LeakOptions()...) }

func TestOneEventArrivesWithItsPropertiesAndIsMarkedPublished(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start(t, options{})
	var id int64
	var eventID string
	var created time.Time
	require.NoError(t, e.pool.QueryRow(context.Background(),
		`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
		 VALUES ('order', 'o-1', 'created', '{"total": 42}', '{"tenant": "acme", "n": 3}')
		 RETURNING id, event_id::text, created_at`).Scan(&id, &eventID, &created))

	d := e.queue.Receive(t, 1, 30*time.Second)[0]
	require.Equal(t, eventID, d.MessageId)
	require.Equal(t, "created", d.Type)
	require.Equal(t, "application/json", d.ContentType)
	require.Equal(t, amqp.Persistent, d.DeliveryMode)
	require.Equal(t, created.Unix(), d.Timestamp.Unix())
	require.Equal(t, e.exchange, d.Exchange)
	require.Equal(t, "order.created", d.RoutingKey)
	require.JSONEq(t, `{"total": 42}`, string(d.Body))
	require.Equal(t, "order", d.Headers["aggregate_type"])
	require.Equal(t, "o-1", d.Headers["aggregate_id"])
	require.Equal(t, "acme", d.Headers["tenant"])
	require.EqualValues(t, 3, d.Headers["n"])
	testkit.WaitFor(t, 10*time.Second, "row marked published", func() bool {
		return e.count(t, fmt.Sprintf("id = %d AND status = 'published' AND published_at IS NOT NULL AND lease_id IS NULL", id)) == 1
	})
}

func TestPerRowExchangeAndRoutingKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	other := testkit.NewExchange(t)
	otherQ := testkit.NewQueue(t, other, "custom.key")
	e.start(t, options{})
	testkit.Exec(t, e.pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, exchange, routing_key)
		VALUES ('order', '1', 'created', '{}', $1, 'custom.key')`, other)
	d := otherQ.Receive(t, 1, 30*time.Second)[0]
	require.Equal(t, other, d.Exchange)
	require.Equal(t, "custom.key", d.RoutingKey)
}

func TestTenThousandEventsArriveExactlyOnce(t *testing.T) {
	t.Parallel()
	const n = 10000
	for _, tc := range []struct {
		name        string
		startBefore bool
		producers   int
	}{
		{"one transaction, relay started before", true, 1},
		{"one transaction, relay started after", false, 1},
		{"16 producers, relay started before", true, 16},
		{"16 producers, relay started after", false, 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			var r *running
			if tc.startBefore {
				r = e.start(t, options{})
			}
			insert(t, e.pool, n, tc.producers)
			if !tc.startBefore {
				r = e.start(t, options{})
			}
			counter := testkit.Counter{}
			e.collect(t, counter, n, 120*time.Second)
			testkit.WaitFor(t, 30*time.Second, "all rows marked published", func() bool {
				return e.count(t, "status = 'published'") == n
			})
			require.NoError(t, r.stop(t))
			counter.Add(e.queue.Drain(t, 30*time.Second))
			require.Len(t, counter, n)
			require.Zero(t, counter.Duplicates(), "no event may arrive twice without a fault")
		})
	}
}

func TestRolledBackInsertsAreNeverPublished(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r := e.start(t, options{})
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', i::text, 'rolled-back', '{}' FROM generate_series(1, 100) i`)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	testkit.Exec(t, e.pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', '1', 'committed', '{}')`)

	got := e.queue.Receive(t, 1, 30*time.Second)
	require.NoError(t, r.stop(t))
	got = append(got, e.queue.Drain(t, 30*time.Second)...)
	require.Len(t, got, 1)
	require.Equal(t, "committed", got[0].Type)
}

// TestListenerReconnectWakesTheRelay terminates the listener's backend: the
// events inserted meanwhile must arrive through the reconnect's wake-up, long
// before the (hour-long) fallback poll.
func TestListenerReconnectWakesTheRelay(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start(t, options{relay: relay.Config{PollInterval: time.Hour}})
	testkit.Exec(t, e.pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', '1', 'first', '{}')`)
	e.queue.Receive(t, 1, 30*time.Second)

	listenerBackend := func() int64 {
		return testkit.QueryInt(t, e.pool, `SELECT coalesce(max(pid), 0) FROM pg_stat_activity
			WHERE application_name = $1 AND datname = current_database()`, notify.ApplicationName)
	}
	old := listenerBackend()
	require.NotZero(t, old)
	testkit.Exec(t, e.pool, `SELECT pg_terminate_backend($1::int)`, old)
	testkit.Exec(t, e.pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', i::text, 'while-disconnected', '{}' FROM generate_series(1, 50) i`)

	got := e.queue.Receive(t, 50, 20*time.Second)
	require.Equal(t, "while-disconnected", got[0].Type)
	testkit.WaitFor(t, 10*time.Second, "a new listener backend", func() bool {
		pid := listenerBackend()
		return pid != 0 && pid != old
	})
}

// TestFallbackPollFindsEventsWithoutNotify runs a relay that nothing wakes
// but its timers: no trigger, no listener, no gate. A sentinel event, written
// before the relay starts, arrives first: the relay's start-up claim has
// happened. Events written after it can then only be found by the periodic
// poll, and two rounds of them must each arrive within a few poll
// intervals; without the poll's ticks they would never arrive.
func TestFallbackPollFindsEventsWithoutNotify(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	testkit.Exec(t, e.pool, `DROP TRIGGER outbox_notify ON outbox`)
	testkit.Exec(t, e.pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', '0', 'sentinel', '{}')`)
	e.start(t, options{relay: relay.Config{PollInterval: 200 * time.Millisecond}, noListen: true, noGate: true})
	require.Equal(t, "sentinel", e.queue.Receive(t, 1, 30*time.Second)[0].Type)
	for round := range 2 {
		kind := fmt.Sprintf("round-%d", round+1)
		testkit.Exec(t, e.pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
			SELECT 'order', i::text, $1, '{}' FROM generate_series(1, 20) i`, kind)
		for _, d := range e.queue.Receive(t, 20, 10*time.Second) {
			require.Equal(t, kind, d.Type)
		}
	}
}

// TestRabbitMQConnectionCutMidStream cuts the relay's broker connection (a
// TCP proxy closes it) while producers are writing: every event still
// arrives, and the relay reconnects by itself.
func TestRabbitMQConnectionCutMidStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	proxy, amqpURL := testkit.NewAMQPProxy(t)
	e.start(t, options{
		publish: publish.Config{URL: amqpURL, ReconnectMin: 20 * time.Millisecond, ReconnectMax: 200 * time.Millisecond},
		claim:   claim.Config{RetryMin: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond},
	})
	counter := e.streamThrough(t, 3000, []int{300, 1500}, func() {
		proxy.Cut()
		proxy.Restore()
	})
	t.Logf("duplicates after two cuts: %d", counter.Duplicates())
}

// TestUnroutableEventsAreRetriedThenDeadLettered sends one event to an
// exchange that does not exist and one to an exchange with no binding: each
// is retried on its schedule and then dead-lettered, while the other events
// keep flowing.
func TestUnroutableEventsAreRetriedThenDeadLettered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	unbound := testkit.NewExchange(t)
	// With the fallback poll an hour away, only the relay's retry timer can
	// bring the failed events back on their schedule.
	e.start(t, options{
		claim: claim.Config{MaxAttempts: 3, RetryMin: 50 * time.Millisecond, RetryMax: 100 * time.Millisecond},
		relay: relay.Config{PollInterval: time.Hour},
	})
	testkit.Exec(t, e.pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, exchange)
		VALUES ('order', '1', 'missing-exchange', '{}', $1), ('order', '2', 'no-binding', '{}', $2)`,
		testkit.UniqueName("missing"), unbound)
	testkit.InsertEvents(t, e.pool, 200)
	e.queue.Receive(t, 200, 30*time.Second)

	testkit.WaitFor(t, 30*time.Second, "both unroutable events dead-lettered", func() bool {
		return e.count(t, "status = 'failed' AND attempts = 3") == 2
	})
	require.Equal(t, int64(1), e.count(t, "event_type = 'missing-exchange' AND last_error LIKE '%not found%'"))
	require.Equal(t, int64(1), e.count(t, "event_type = 'no-binding' AND last_error LIKE '%NO_ROUTE%'"))
	testkit.InsertEvents(t, e.pool, 10)
	e.queue.Receive(t, 10, 30*time.Second)
}

// TestMalformedRowsAreDeadLetteredAlone: a row whose headers are not a JSON
// object and a row whose payload is over the size limit are dead-lettered at
// once with a clear error; the rest of their batch is delivered.
func TestMalformedRowsAreDeadLetteredAlone(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start(t, options{publish: publish.Config{MaxMessageSize: 1024}})
	testkit.Exec(t, e.pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers) VALUES
		('order', '1', 'ok', '{}', NULL),
		('order', '2', 'bad-headers', '{}', '[1, 2]'),
		('order', '3', 'too-big', jsonb_build_object('blob', repeat('x', 2000)), NULL),
		('order', '4', 'ok', '{}', NULL)`)
	got := e.queue.Receive(t, 2, 30*time.Second)
	require.Equal(t, "ok", got[0].Type)
	require.Equal(t, "ok", got[1].Type)
	testkit.WaitFor(t, 30*time.Second, "malformed rows dead-lettered", func() bool {
		return e.count(t, "status = 'failed' AND attempts = 1") == 2
	})
	require.Equal(t, int64(1), e.count(t, "event_type = 'bad-headers' AND last_error LIKE '%headers%'"))
	require.Equal(t, int64(1), e.count(t, "event_type = 'too-big' AND last_error LIKE '%1024%'"))
}

// TestShutdownSettlesInFlightBatches stops a relay whose broker is slow
// while it has batches in flight: it returns, and every row is either
// published or back to claimable — no lease is left behind.
func TestShutdownSettlesInFlightBatches(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	proxy, amqpURL := testkit.NewAMQPProxy(t)
	r := e.start(t, options{
		publish: publish.Config{URL: amqpURL},
		relay:   relay.Config{BatchSize: 50, Workers: 2},
	})
	testkit.InsertEvents(t, e.pool, 2000)
	e.queue.Receive(t, 1, 30*time.Second)
	proxy.Latency(100 * time.Millisecond)
	require.NoError(t, r.stop(t))
	require.Zero(t, e.count(t, "lease_id IS NOT NULL"), "a stopped relay leaves no lease")
	require.Zero(t, e.count(t, "status = 'pending' AND available_at > now()"))
	published := e.count(t, "status = 'published'")
	require.Less(t, published, int64(2000), "the test must stop the relay mid-drain")
	require.Equal(t, int64(2000)-published, e.count(t, "status = 'pending' AND attempts = 0"))
}

func TestCleanupDeletesOnlyOldPublishedRows(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	testkit.Exec(t, e.pool, `ALTER TABLE outbox DISABLE TRIGGER outbox_notify`)
	testkit.Exec(t, e.pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, status, published_at, available_at)
		SELECT 'a', i::text, s.kind, '{}', s.status, s.published_at, now() + interval '1 day'
		FROM generate_series(1, 30) i,
		(VALUES ('old', 'published', now() - interval '2 hours'),
		        ('recent', 'published', now() - interval '5 minutes'),
		        ('pending', 'pending', NULL),
		        ('dead', 'failed', NULL)) AS s (kind, status, published_at)`)
	e.start(t, options{relay: relay.Config{Retention: time.Hour, CleanupInterval: 50 * time.Millisecond, CleanupBatch: 7}})
	testkit.WaitFor(t, 30*time.Second, "old published rows deleted", func() bool {
		return e.count(t, "event_type = 'old'") == 0
	})
	require.Equal(t, int64(30), e.count(t, "event_type = 'recent'"))
	require.Equal(t, int64(30), e.count(t, "event_type = 'pending'"))
	require.Equal(t, int64(30), e.count(t, "event_type = 'dead'"))
}

// TestRelayBackendsTerminatedMidStream terminates every PostgreSQL backend
// of the relay (pool and listener) again and again while producers write:
// the pool and the listener reconnect by themselves and every event
// arrives.
func TestRelayBackendsTerminatedMidStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start(t, options{relay: relay.Config{BatchSize: 50}})
	counter := e.streamThrough(t, 3000, []int{200, 800, 1600, 2400}, func() {
		terminated := testkit.QueryInt(t, e.pool, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name IN ('outboxrelay', $1)`, notify.ApplicationName)
		require.Positive(t, terminated)
	})
	t.Logf("duplicates after four rounds of terminated backends: %d", counter.Duplicates())
}

// TestFailedClaimIsRetriedSoon makes a claim fail (it times out on a table
// locked by the test) with the NOTIFY trigger disabled and the fallback poll
// an hour away: the relay retries the claim by itself, with backoff, and the
// event arrives once the lock is gone.
//
// It also guards claim.Config.ConfigurePool's statement_timeout: without it,
// the timed-out claim's statement outlives the client (pgx's cancel request
// races the test's commit) and, about one run in three, commits a lease no
// one holds, so the event waits for the lease to expire.
func TestFailedClaimIsRetriedSoon(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	testkit.Exec(t, e.pool, `ALTER TABLE outbox DISABLE TRIGGER outbox_notify`)
	logs := &testkit.Buffer{}
	e.start(t, options{
		claim: claim.Config{QueryTimeout: 300 * time.Millisecond},
		relay: relay.Config{PollInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(logs, nil))},
	})
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', '1', 'locked', '{}')`)
	require.NoError(t, err)
	testkit.Exec(t, e.pool, `NOTIFY outbox`) // the wake-up the disabled trigger would have sent
	testkit.WaitFor(t, 30*time.Second, "a claim failed", func() bool {
		return strings.Contains(logs.String(), "claim failed")
	})
	require.NoError(t, tx.Commit(ctx))
	d := e.queue.Receive(t, 1, 30*time.Second)[0]
	require.Equal(t, "locked", d.Type)
}

// TestSlowBatchKeepsItsLease: a batch whose publish outlasts its lease
// (RabbitMQ is 1 s away each way, the lease 1.5 s) keeps its rows: the
// relay renews the lease while the batch is in flight, so a second relay
// claiming every 50 ms never takes them, and nothing is published twice.
func TestSlowBatchKeepsItsLease(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	proxy, amqpURL := testkit.NewAMQPProxy(t)
	lease := claim.Config{Lease: 1500 * time.Millisecond}
	e.start(t, options{
		claim:   lease,
		publish: publish.Config{URL: amqpURL, ConfirmTimeout: time.Minute},
		relay:   relay.Config{Workers: 1, PollInterval: time.Hour},
	})
	// Connected while the link was fast; slow from the first batch on.
	proxy.Latency(1000 * time.Millisecond)
	testkit.InsertEvents(t, e.pool, 20)
	testkit.WaitFor(t, 10*time.Second, "the slow relay's claim", func() bool {
		return e.count(t, "lease_id IS NOT NULL") == 20
	})
	e.start(t, options{claim: lease, relay: relay.Config{PollInterval: 50 * time.Millisecond}, noListen: true})

	got := e.queue.Receive(t, 20, time.Minute)
	testkit.WaitFor(t, 30*time.Second, "every event marked published", func() bool {
		return e.count(t, "status = 'published'") == 20
	})
	ids := testkit.Counter{}
	ids.Add(got)
	ids.Add(e.queue.Drain(t, 30*time.Second))
	require.Len(t, ids, 20)
	require.Zero(t, ids.Duplicates(), "a lapsed lease let the other relay publish again")
	require.Equal(t, int64(20), e.count(t, "attempts = 1"), "every event was claimed once")
}
