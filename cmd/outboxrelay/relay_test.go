package main_test

import (
	"context"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/notify"
)

// collect receives deliveries until want distinct message ids have arrived.
func collect(t *testing.T, q *testkit.Queue, counter testkit.Counter, want int, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for len(counter) < want {
		select {
		case d := <-q.Deliveries:
			counter[d.MessageId]++
		case <-deadline.C:
			t.Fatalf("%d of %d events arrived within %s", len(counter), want, timeout)
		}
	}
}

// TestKilledRelaysLeasesPassToAnotherRelay kills a relay with SIGKILL while
// it holds leases on events it could not publish (its broker connection is
// black-holed); a second relay delivers those events once the leases expire.
func TestKilledRelaysLeasesPassToAnotherRelay(t *testing.T) {
	t.Parallel()
	dbURL, pool := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "#")
	proxy, amqpURL := testkit.NewAMQPProxy(t)

	a := startRelay(t, relayEnv(dbURL, exchange, "AMQP_URL="+amqpURL),
		"--lease=10s", "--confirm-timeout=8s", "--poll-interval=200ms")
	testkit.InsertEvents(t, pool, 1)
	queue.Receive(t, 1, 30*time.Second)

	proxy.Blackhole()
	testkit.InsertEvents(t, pool, 300)
	testkit.WaitFor(t, 20*time.Second, "relay A holds leases", func() bool {
		return testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE lease_id IS NOT NULL AND available_at > now()`) > 0
	})
	a.Kill()
	// A relay that cannot reach its broker also settles batches as retries
	// when their confirms time out, so the rows it held at the kill are
	// recorded by id, with the attempts they had then.
	leased := map[int64]int64{}
	rows, err := pool.Query(context.Background(), `SELECT id, attempts FROM outbox WHERE lease_id IS NOT NULL`)
	require.NoError(t, err)
	for rows.Next() {
		var id, attempts int64
		require.NoError(t, rows.Scan(&id, &attempts))
		leased[id] = attempts
	}
	require.NoError(t, rows.Err())
	require.NotEmpty(t, leased, "relay A held leases when it was killed")

	b := startRelay(t, relayEnv(dbURL, exchange), "--poll-interval=200ms")
	counter := testkit.Counter{}
	collect(t, queue, counter, 300, 60*time.Second)
	testkit.WaitFor(t, 30*time.Second, "every event published", func() bool {
		return testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE status = 'published'`) == 301
	})
	for id, before := range leased {
		require.Greater(t, testkit.QueryInt(t, pool, `SELECT attempts FROM outbox WHERE id = $1`, id), before,
			"event %d, leased by the killed relay, was claimed again after its lease expired", id)
	}
	b.Stop(60 * time.Second)
}

// --retention=0 keeps no published row: each confirmed event's row is
// deleted in place of its mark, and cleanup removes the published rows an
// earlier run kept, however recent.
func TestRetentionZeroKeepsNoPublishedRow(t *testing.T) {
	t.Parallel()
	dbURL, pool := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "#")
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, status, published_at)
		SELECT 'order', i::text, 'kept', '{}', 'published', now() FROM generate_series(1, 10) AS i`)

	p := startRelay(t, relayEnv(dbURL, exchange, "OUTBOX_RETENTION=0", "OUTBOX_CLEANUP_INTERVAL=1h"))
	testkit.WaitFor(t, 30*time.Second, "the rows an earlier run kept deleted", func() bool {
		return testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox`) == 0
	})
	testkit.InsertEvents(t, pool, 200)
	counter := testkit.Counter{}
	collect(t, queue, counter, 200, 30*time.Second)
	testkit.WaitFor(t, 30*time.Second, "every delivered event's row deleted", func() bool {
		return testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox`) == 0
	})
	p.Stop(60 * time.Second)
}

// TestThreeRelaysDeliverEachEventOnce runs three relay processes on one table
// while producers write 20,000 events: each arrives exactly once.
func TestThreeRelaysDeliverEachEventOnce(t *testing.T) {
	t.Parallel()
	const n = 20000
	dbURL, pool := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "#")
	testkit.InsertEvents(t, pool, n/4)
	relays := make([]*testkit.Process, 3)
	for i := range relays {
		relays[i] = startRelay(t, relayEnv(dbURL, exchange), "--batch-size=100", "--workers=2")
	}
	var wg sync.WaitGroup
	for p := range 8 {
		wg.Go(func() {
			for i := p; i < n-n/4; i += 8 {
				if _, err := pool.Exec(context.Background(),
					`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'created', '{}')`, strconv.Itoa(i%31)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	counter := testkit.Counter{}
	collect(t, queue, counter, n, 180*time.Second)
	wg.Wait()
	testkit.WaitFor(t, 60*time.Second, "every event published", func() bool {
		return testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE status = 'published'`) == n
	})
	for _, r := range relays {
		r.Stop(60 * time.Second)
	}
	counter.Add(queue.Drain(t, 30*time.Second))
	require.Len(t, counter, n)
	require.Zero(t, counter.Duplicates())
}

// TestDropInOnSeedTable is the drop-in acceptance case: the outbox_events
// table exactly as the seed article creates it, 1,000 rows already pending,
// the install script applied with psql, the relay pointed at it.
func TestDropInOnSeedTable(t *testing.T) {
	t.Parallel()
	dbURL := testkit.NewDatabase(t)
	pool := testkit.NewPool(t, dbURL)
	testkit.Exec(t, pool, seedTable)
	testkit.Exec(t, pool, `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'User', i::text, 'UserCreated', jsonb_build_object('email', 'user' || i || '@example.com')
		FROM generate_series(1, 1000) i`)
	vars := []string{"-v", "table=outbox_events", "-v", "event_id_column=id",
		"-v", "status_pending=PENDING", "-v", "status_published=PUBLISHED", "-v", "status_failed=FAILED"}
	psql(t, dbURL, append(vars, "-f", "../../sql/outboxrelay_install.sql")...)
	before := schemaOf(t, dbURL, "outbox_events")
	psql(t, dbURL, append(vars, "-f", "../../sql/outboxrelay_install.sql")...)
	require.Equal(t, before, schemaOf(t, dbURL, "outbox_events"), "running the install twice changes nothing")

	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "User.#")
	r := startRelay(t, relayEnv(dbURL, exchange), "--no-migrate", "--table=public.outbox_events",
		"--column-id=relay_id", "--column-event-id=id",
		"--status-pending=PENDING", "--status-published=PUBLISHED", "--status-failed=FAILED")
	counter := testkit.Counter{}
	collect(t, queue, counter, 1000, 60*time.Second)
	// A producer keeps writing the seed's way; the trigger wakes the relay.
	var newID string
	require.NoError(t, pool.QueryRow(context.Background(), `INSERT INTO outbox_events (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('User', '1001', 'UserCreated', '{}') RETURNING id::text`).Scan(&newID))
	d := queue.Receive(t, 1, 30*time.Second)[0]
	require.Equal(t, newID, d.MessageId, "the table's own uuid is the message id")
	testkit.WaitFor(t, 30*time.Second, "status PUBLISHED in the table's vocabulary", func() bool {
		return testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox_events WHERE status = 'PUBLISHED'`) == 1001
	})
	r.Stop(60 * time.Second)

	psql(t, dbURL, "-v", "table=outbox_events", "-f", "../../sql/outboxrelay_uninstall.sql")
	psql(t, dbURL, "-v", "table=outbox_events", "-f", "../../sql/outboxrelay_uninstall.sql")
	require.Zero(t, testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_trigger WHERE tgname = 'outboxrelay_notify'`))
	require.Equal(t, int64(1), testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_indexes WHERE tablename = 'outbox_events'`))
	require.Equal(t, int64(19), testkit.QueryInt(t, pool, `SELECT count(*) FROM information_schema.columns WHERE table_name = 'outbox_events'`))
	psql(t, dbURL, "-v", "table=outbox_events", "-v", "drop_columns=on", "-f", "../../sql/outboxrelay_uninstall.sql")
	require.Equal(t, int64(7), testkit.QueryInt(t, pool, `SELECT count(*) FROM information_schema.columns WHERE table_name = 'outbox_events'`),
		"back to the seed's seven columns")
}

// seedTable is the outbox table of seed article 001, verbatim.
const seedTable = `CREATE TABLE outbox_events (
id UUID PRIMARY KEY DEFAULT gen_random_uuid(),
aggregate_type VARCHAR(255) NOT NULL,
aggregate_id VARCHAR(255) NOT NULL,
event_type VARCHAR(255) NOT NULL,
payload JSONB NOT NULL,
status VARCHAR(50) DEFAULT 'PENDING',
created_at TIMESTAMP WITH TIME ZONE DEFAULT NOW()
)`

func psql(t *testing.T, dbURL string, args ...string) string {
	t.Helper()
	cmd := exec.Command("psql", append([]string{dbURL, "-X", "-q"}, args...)...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	return string(out)
}

// schemaOf describes a table's columns, indexes and triggers.
func schemaOf(t *testing.T, dbURL, table string) string {
	t.Helper()
	return psql(t, dbURL, "-c", `SELECT string_agg(column_name || ' ' || data_type || ' ' || coalesce(column_default, ''), E'\n' ORDER BY ordinal_position)
		FROM information_schema.columns WHERE table_name = '`+table+`'`,
		"-c", `SELECT string_agg(indexdef, E'\n' ORDER BY indexname) FROM pg_indexes WHERE tablename = '`+table+`'`,
		"-c", `SELECT string_agg(pg_get_triggerdef(oid), E'\n' ORDER BY tgname) FROM pg_trigger WHERE tgrelid = '`+table+`'::regclass`)
}

// Names from configuration are quoted identifiers end to end: a schema, a
// table and a channel whose names hold quotes, semicolons and SQL are
// installed by the drop-in script and relayed by the binary, with the
// fallback poll an hour away so that the hostile channel's notifications
// must wake the relay, and nothing else in the database is touched.
func TestHostileNamesCannotInjectSQL(t *testing.T) {
	t.Parallel()
	dbURL := testkit.NewDatabase(t)
	pool := testkit.NewPool(t, dbURL)
	testkit.Exec(t, pool, `CREATE TABLE canary (id int)`)
	const (
		schema  = `s"; DROP TABLE canary; --`
		table   = `t'); DROP TABLE canary; --`
		channel = `c"; NOTIFY x; --`
	)
	testkit.Exec(t, pool, `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize())
	testkit.Exec(t, pool, `CREATE TABLE `+pgx.Identifier{schema, table}.Sanitize()+` (
		id bigint GENERATED ALWAYS AS IDENTITY, aggregate_type text NOT NULL, aggregate_id text NOT NULL,
		event_type text NOT NULL, payload jsonb NOT NULL)`)
	psql(t, dbURL, "-v", "schema="+schema, "-v", "table="+table, "-v", "channel="+channel,
		"-v", "id_column=id", "-f", "../../sql/outboxrelay_install.sql")

	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "#")
	r := startRelay(t, relayEnv(dbURL, exchange), "--no-migrate", "--table="+schema+"."+table,
		"--channel="+channel, "--poll-interval=1h")
	testkit.WaitFor(t, 10*time.Second, "the relay listening", func() bool {
		return testkit.ListenLocks(t, pool, notify.ListenLockClass) == 1
	})
	testkit.Exec(t, pool, `INSERT INTO `+pgx.Identifier{schema, table}.Sanitize()+` (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', i::text, 'created', '{}' FROM generate_series(1, 20) i`)
	queue.Receive(t, 20, 30*time.Second)
	r.Stop(60 * time.Second)
	require.Equal(t, int64(1), testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_tables WHERE tablename = 'canary'`))
	require.Equal(t, int64(20), testkit.QueryInt(t, pool, `SELECT count(*) FROM `+pgx.Identifier{schema, table}.Sanitize()+` WHERE status = 'published'`))
}
