package main_test

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/notify"
)

// catalogOf lists every relation, trigger and function of the public
// schema with its row version (xmin): two listings are equal only if
// nothing was created, dropped or changed in between.
func catalogOf(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	var rows []string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT array_agg(x ORDER BY x) FROM (
		SELECT 'relation ' || relname || ' ' || xmin FROM pg_class WHERE relnamespace = 'public'::regnamespace
		UNION ALL SELECT 'trigger ' || tgname || ' ' || xmin || ' ' || tgenabled::text FROM pg_trigger
			WHERE NOT tgisinternal AND tgrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'public'::regnamespace)
		UNION ALL SELECT 'function ' || proname || ' ' || xmin FROM pg_proc WHERE pronamespace = 'public'::regnamespace) AS c (x)`).Scan(&rows))
	return rows
}

// sqlInstall pipes `outboxrelay sql` with args into psql on dbURL and
// returns what psql printed.
func sqlInstall(t *testing.T, dbURL string, args ...string) string {
	t.Helper()
	code, script, stderr := runOnce(t, adminEnv("postgres://nobody@127.0.0.1:1/none"), append([]string{"sql"}, args...)...)
	require.Equal(t, 0, code, stderr)
	cmd := exec.Command("psql", dbURL, "-X", "-q")
	cmd.Stdin = strings.NewReader(script)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	return string(out)
}

// duplicateIndexes lists the indexes of table whose definition another
// index of it has too.
func duplicateIndexes(t *testing.T, pool *pgxpool.Pool, table string) []string {
	t.Helper()
	var names []string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT coalesce(array_agg(indexrelid::regclass::text), '{}') FROM (
		SELECT indexrelid, count(*) OVER (PARTITION BY substring(pg_get_indexdef(indexrelid) FROM ' USING .*$')) AS n
		FROM pg_index WHERE indrelid = $1::regclass) AS i WHERE n > 1`, table).Scan(&names))
	return names
}

// notifyTriggers counts the triggers on table that call outboxrelay_notify().
func notifyTriggers(t *testing.T, pool *pgxpool.Pool, table string) int64 {
	t.Helper()
	return testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_trigger AS t JOIN pg_proc AS p ON p.oid = t.tgfoid
		WHERE t.tgrelid = $1::regclass AND p.proname = 'outboxrelay_notify'`, table)
}

// The install SQL adds only what a table lacks, whether the table came
// from the migrations or from an earlier run of the script: over the
// migrated table, `sql --ordering aggregate | psql` adds the ordering
// index and nothing else (no second trigger, no copies of the migrations'
// indexes), and a second run changes nothing at all; the same holds over a
// team's own table. Over a table an earlier version of the script made
// worse (its own trigger and indexes beside the migrations'), it drops
// the copies.
func TestInstallSQLAddsOnlyWhatIsMissing(t *testing.T) {
	t.Parallel()
	t.Run("migrated", func(t *testing.T) {
		t.Parallel()
		dbURL, pool := testkit.NewOutbox(t)
		before := catalogOf(t, pool)
		sqlInstall(t, dbURL, "--ordering=aggregate")
		after := catalogOf(t, pool)
		added := []string{}
		for _, row := range after {
			if !strings.Contains(strings.Join(before, "\n"), row) {
				added = append(added, strings.Fields(row)[1])
			}
		}
		require.Equal(t, []string{"outbox_relay_failed_key_idx", "outbox_relay_ordering_idx"}, added)
		require.Equal(t, int64(1), notifyTriggers(t, pool, "outbox"))
		require.Empty(t, duplicateIndexes(t, pool, "outbox"))
		sqlInstall(t, dbURL, "--ordering=aggregate")
		require.Equal(t, after, catalogOf(t, pool), "a second run changed the catalog")
	})
	t.Run("drop-in", func(t *testing.T) {
		t.Parallel()
		d := newDropInTable(t)
		before := catalogOf(t, d.Pool)
		psql(t, d.URL, append(dropInVars, "-f", "../../sql/outboxrelay_install.sql")...)
		sqlInstall(t, d.URL, dropInFlags...)
		require.Equal(t, before, catalogOf(t, d.Pool), "running the script again changed the catalog")
		require.Equal(t, int64(1), notifyTriggers(t, d.Pool, "app_events"))
		require.Empty(t, duplicateIndexes(t, d.Pool, "app_events"))
	})
	t.Run("repaired", func(t *testing.T) {
		t.Parallel()
		dbURL, pool := testkit.NewOutbox(t)
		// What the script of version 6 added over the migrated table.
		testkit.Exec(t, pool, fmt.Sprintf(`CREATE UNIQUE INDEX outbox_relay_id_idx ON outbox (id);
			CREATE INDEX outbox_relay_pending_idx ON outbox (id) WHERE status = 'pending';
			CREATE INDEX outbox_relay_published_idx ON outbox (published_at) WHERE status = 'published';
			CREATE INDEX outbox_relay_failed_idx ON outbox (id) WHERE status = 'failed';
			CREATE TRIGGER outboxrelay_notify AFTER INSERT ON outbox FOR EACH STATEMENT
				WHEN (pg_try_advisory_xact_lock_shared(%d, hashtext('outbox')))
				EXECUTE FUNCTION outboxrelay_notify('outbox', 'public.outbox_wakeup')`, notify.GateLockClass))
		out := sqlInstall(t, dbURL)
		require.Contains(t, out, "dropped trigger outboxrelay_notify, which duplicated outbox_notify")
		require.Equal(t, int64(1), notifyTriggers(t, pool, "outbox"))
		require.Empty(t, duplicateIndexes(t, pool, "outbox"))
		require.Equal(t, int64(5), testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_index WHERE indrelid = 'outbox'::regclass`),
			"the primary key and the migrations' four partial indexes")
	})
}

// migrate takes the schema settings run does: with --ordering aggregate
// (or OUTBOX_ORDERING) it builds the ordering index, so a relay in ordered
// mode starts with --no-migrate; with --channel it makes the trigger
// notify that channel and try its locks.
func TestMigrateTakesTheSchemaFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  []string
		args []string
	}{
		{"flag", nil, []string{"--ordering=aggregate", "--channel=orders"}},
		{"environment", []string{"OUTBOX_ORDERING=aggregate", "OUTBOX_CHANNEL=orders"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dbURL := testkit.NewDatabase(t)
			code, _, stderr := runOnce(t, adminEnv(dbURL, tc.env...), append([]string{"migrate"}, tc.args...)...)
			require.Equal(t, 0, code, stderr)
			pool := testkit.NewPool(t, dbURL)
			require.Equal(t, int64(2), testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_index
				WHERE indrelid = 'outbox'::regclass AND indisvalid AND indkey::text = '3 4 ' || (SELECT attnum FROM pg_attribute WHERE attrelid = 'outbox'::regclass AND attname = 'relay_seq')
				  AND indexrelid::regclass::text IN ('outbox_relay_ordering_idx', 'outbox_relay_failed_key_idx')`), "the ordered mode's indexes")
			ts, err := notify.InspectTriggers(context.Background(), pool, pgx.Identifier{"outbox"})
			require.NoError(t, err)
			require.NoError(t, ts.Check("outbox", "orders"))

			exchange := testkit.NewExchange(t)
			queue := testkit.NewQueue(t, exchange, "#")
			p := startRelay(t, relayEnv(dbURL, exchange, tc.env...), append([]string{"--no-migrate", "--ordering=aggregate", "--channel=orders"}, tc.args...)...)
			testkit.InsertEvents(t, pool, 3)
			queue.Receive(t, 3, 30*time.Second)
			p.Stop(30 * time.Second)
		})
	}
}

// --channel with the built-in migrations: the trigger they create notifies
// the relay's channel and tries its locks, so the relay is woken (the
// trigger function runs for an insert) and its gate and listen lock are
// the ones the trigger tries.
func TestMigrationsHonourTheChannel(t *testing.T) {
	t.Parallel()
	dbURL := testkit.NewDatabase(t)
	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "#")
	p := startRelay(t, relayEnv(dbURL, exchange), "--channel=custom", "--poll-interval=1h")
	addr := testkit.HTTPAddr(t, p.Out)
	testkit.AwaitStatus(t, addr, "/readyz", 200)
	pool := testkit.NewPool(t, dbURL)
	ts, err := notify.InspectTriggers(context.Background(), pool, pgx.Identifier{"outbox"})
	require.NoError(t, err)
	require.Len(t, ts, 1)
	require.Equal(t, "custom", ts[0].Channel)
	require.Equal(t, []string{"custom", "custom"}, ts[0].WhenChannels)
	testkit.WaitFor(t, 30*time.Second, "the relay to hold the listen lock", func() bool {
		return testkit.ListenLocks(t, pool, notify.ListenLockClass) == 1
	})
	require.Equal(t, int64(1), testkit.TriggerCalls(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('order', '1', 'created', '{}')`), "the relay listens: the trigger notifies")
	queue.Receive(t, 1, 30*time.Second)
	p.Stop(30 * time.Second)
}

// A relay whose table's trigger notifies another channel would wait for
// the sequence check on every event, and its gate would silence nothing:
// it refuses to start (exit 2) naming both channels. Once running, a
// trigger changed to another channel turns /readyz 503, naming it.
func TestRelayRefusesATriggerOfAnotherChannel(t *testing.T) {
	t.Parallel()
	dbURL, _ := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	code, _, stderr := runOnce(t, relayEnv(dbURL, exchange), "--no-migrate", "--channel=custom")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, `notifies channel "outbox"`)
	require.Contains(t, stderr, `--channel is "custom"`)

	p := startRelay(t, relayEnv(dbURL, exchange), "--no-migrate")
	addr := testkit.HTTPAddr(t, p.Out)
	testkit.AwaitStatus(t, addr, "/readyz", 200)
	sqlInstall(t, dbURL, "--channel=elsewhere")
	body := testkit.AwaitStatus(t, addr, "/readyz", 503)
	require.Contains(t, body, `notifies channel \"elsewhere\"`)
	sqlInstall(t, dbURL)
	testkit.AwaitStatus(t, addr, "/readyz", 200)
	p.Stop(30 * time.Second)
}

// run refuses a table the built-in migrations do not create, with the
// migrations on, before it creates anything, and says how to set the
// table up; migrate --table does that on an existing table (and refuses
// one that does not exist), after which the relay runs with --no-migrate.
func TestTableOfYourOwnIsSetUpByMigrate(t *testing.T) {
	t.Parallel()
	dbURL := testkit.NewDatabase(t)
	pool := testkit.NewPool(t, dbURL)
	exchange := testkit.NewExchange(t)
	code, _, stderr := runOnce(t, relayEnv(dbURL, exchange), "--table=events")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, "outboxrelay migrate --table events")
	require.Contains(t, stderr, "--no-migrate")
	require.Zero(t, testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace`),
		"run created something before refusing")

	code, _, stderr = runOnce(t, adminEnv(dbURL), "migrate", "--table=events")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, "--table events: no such table")

	testkit.Exec(t, pool, `CREATE TABLE events (aggregate_type text NOT NULL, aggregate_id text NOT NULL,
		event_type text NOT NULL, payload jsonb NOT NULL)`)
	code, _, stderr = runOnce(t, adminEnv(dbURL), "migrate", "--table=events", "--column-id=relay_id")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "added column relay_id")
	queue := testkit.NewQueue(t, exchange, "#")
	p := startRelay(t, relayEnv(dbURL, exchange), "--no-migrate", "--table=events", "--column-id=relay_id")
	testkit.Exec(t, pool, `INSERT INTO events (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', '1', 'created', '{}')`)
	queue.Receive(t, 1, 30*time.Second)
	p.Stop(30 * time.Second)
	require.Zero(t, testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_class WHERE relname = 'outbox'`))
}

// With no relay running, an insert calls no trigger function and sends no
// NOTIFY (whose lock serializes producers' commits); a running relay makes
// the trigger notify; a relay killed with SIGKILL releases its listen lock
// with its session, and inserts are silent again.
func TestTriggerNotifiesOnlyWhileARelayListens(t *testing.T) {
	t.Parallel()
	dbURL, pool := testkit.NewOutbox(t)
	const insert = `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', '1', 'created', '{}')`
	require.Zero(t, testkit.TriggerCalls(t, pool, insert), "no relay runs: the trigger function ran")

	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "#")
	p := startRelay(t, relayEnv(dbURL, exchange), "--poll-interval=1h")
	testkit.WaitFor(t, 30*time.Second, "the relay to hold the listen lock", func() bool {
		return testkit.ListenLocks(t, pool, notify.ListenLockClass) == 1
	})
	require.Equal(t, int64(1), testkit.TriggerCalls(t, pool, insert), "a relay listens: the trigger function did not run")
	queue.Receive(t, 2, 30*time.Second) // the first, found by the claim after the listen lock was taken

	p.Kill()
	testkit.WaitFor(t, 30*time.Second, "the killed relay's listen lock to go", func() bool {
		return testkit.ListenLocks(t, pool, notify.ListenLockClass) == 0
	})
	require.Zero(t, testkit.TriggerCalls(t, pool, insert), "the relay is gone: the trigger function ran")
}
