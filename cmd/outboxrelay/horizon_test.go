package main_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// insertLater inserts n events in batches of 100, each its own transaction.
func insertLater(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	for range n / 100 {
		testkit.InsertEvents(t, pool, 100)
	}
}

// A transaction takes an id and commits only after thousands of events
// with later ids have been published: the relay's floor waits below its
// id, and the event is delivered once committed. The fallback poll is an
// hour away (but where the relay polls only): its commit's notification,
// or the relay's sequence check, is what finds it. Behind PgBouncer in
// transaction mode too, and with --no-listen within its poll.
func TestLateCommitIsDeliveredPastThousandsOfLaterEvents(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  func(t *testing.T, direct string) (url string, extra []string)
	}{
		{"listening", func(_ *testing.T, direct string) (string, []string) {
			return direct, []string{"OUTBOX_POLL_INTERVAL=1h"}
		}},
		{"behind PgBouncer", func(t *testing.T, direct string) (string, []string) {
			return testkit.NewPgBouncer(t, direct), []string{"OUTBOX_LISTENER_URL=" + direct, "OUTBOX_POLL_INTERVAL=1h"}
		}},
		{"poll only", func(_ *testing.T, direct string) (string, []string) {
			return direct, []string{"OUTBOX_NO_LISTEN=true", "OUTBOX_MIGRATE=false", "OUTBOX_POLL_INTERVAL=1s"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			direct, pool := testkit.NewOutbox(t)
			exchange := testkit.NewExchange(t)
			queue := testkit.NewQueue(t, exchange, "#")
			url, extra := tc.env(t, direct)
			p := startRelay(t, relayEnv(url, exchange, extra...))
			seen := testkit.Counter{}
			testkit.InsertEvents(t, pool, 1)
			collect(t, queue, seen, 1, 30*time.Second) // the relay is up

			ctx := context.Background()
			late, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer late.Rollback(ctx) //nolint:errcheck // committed below
			var lateID int64
			require.NoError(t, late.QueryRow(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
				VALUES ('order', 'late', 'created', '{}') RETURNING id`).Scan(&lateID))
			insertLater(t, pool, 5000)
			collect(t, queue, seen, 5001, 60*time.Second)

			require.NoError(t, late.Commit(ctx))
			d := queue.Receive(t, 1, 30*time.Second)[0]
			var id int64
			require.NoError(t, pool.QueryRow(ctx, `SELECT id FROM outbox WHERE event_id = $1`, d.MessageId).Scan(&id))
			require.Equal(t, lateID, id, "the late event")
			p.Stop(30 * time.Second)
		})
	}
}

// An event whose publish fails backs off below the floor while thousands
// of later events go out; it is delivered when its retry falls due, the
// fallback poll an hour away.
func TestRetriedEventBelowTheFloorIsDeliveredWhenDue(t *testing.T) {
	t.Parallel()
	dbURL, pool := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "ok.#")
	p := startRelay(t, relayEnv(dbURL, exchange), "--poll-interval=1h", "--retry-min=2s", "--retry-max=2s")
	// Unroutable until a queue is bound for it: returned, and retried.
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, routing_key)
		VALUES ('order', 'retried', 'created', '{}', 'later.1')`)
	testkit.WaitFor(t, 30*time.Second, "the event's first attempt to fail", func() bool {
		return testkit.QueryInt(t, pool, `SELECT attempts FROM outbox WHERE aggregate_id = 'retried'`) >= 1 &&
			testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE aggregate_id = 'retried' AND last_error IS NOT NULL`) == 1
	})
	ctx := context.Background()
	for i := range 30 {
		testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, routing_key)
			SELECT 'order', g::text, 'created', '{}', 'ok.' || $1 FROM generate_series(1, 100) AS g`, strconv.Itoa(i))
	}
	collect(t, queue, testkit.Counter{}, 3000, 60*time.Second)

	later := testkit.NewQueue(t, exchange, "later.#")
	d := later.Receive(t, 1, 30*time.Second)[0]
	var aggregate string
	require.NoError(t, pool.QueryRow(ctx, `SELECT aggregate_id FROM outbox WHERE event_id = $1`, d.MessageId).Scan(&aggregate))
	require.Equal(t, "retried", aggregate)
	p.Stop(30 * time.Second)
}

// A relay killed while it holds leases (its broker black-holed) leaves
// them below the floor of the relay that stays, which publishes thousands
// of later events meanwhile: once the leases expire, it delivers those
// events too, waking for them when they fall due, with the fallback poll
// an hour away and nothing else inserted. The killed relay holds 30 leases
// (30 workers, batches of 10), which lapse 4 s after its claims: the floor
// parks a lease once it has held the floor for a second, or has lapsed,
// and most of the 30 lapse first.
func TestKilledRelaysLeasedEventsBelowTheFloorAreDelivered(t *testing.T) {
	t.Parallel()
	dbURL, pool := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "#")
	proxy, amqpURL := testkit.NewAMQPProxy(t)
	a := startRelay(t, relayEnv(dbURL, exchange, "AMQP_URL="+amqpURL), "--lease=4s", "--confirm-timeout=3s",
		"--workers=30", "--batch-size=10")
	testkit.InsertEvents(t, pool, 1)
	queue.Receive(t, 1, 30*time.Second)
	// Relay A marks the first event before the black hole: had its
	// confirmation been lost there, the event would stay leased beside the
	// 300, the wait below would see no 300 leases until A's publishes had
	// failed and been retried, and would stop at an instant of A's retries,
	// with any 300 of the 301 leased.
	testkit.WaitFor(t, 30*time.Second, "relay A to mark the first event", func() bool {
		return testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE status = 'pending'`) == 0
	})
	proxy.Blackhole()
	testkit.InsertEvents(t, pool, 300)
	testkit.WaitFor(t, 20*time.Second, "relay A to hold the 300 events' leases", func() bool {
		return testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox
			WHERE status = 'pending' AND lease_id IS NOT NULL AND available_at > now()`) == 300
	})
	a.Kill()

	b := startRelay(t, relayEnv(dbURL, exchange), "--poll-interval=1h")
	insertLater(t, pool, 3000)
	seen := testkit.Counter{}
	collect(t, queue, seen, 3300, 90*time.Second)
	testkit.WaitFor(t, 30*time.Second, "every event marked published", func() bool {
		return testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE status = 'pending'`) == 0
	})
	b.Stop(30 * time.Second)
}
