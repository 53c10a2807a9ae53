package main_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// seed003Table is an outbox keyed by one column, entity_key, with the
// status values of seed 003.
const seed003Table = `CREATE TABLE outbox (
id bigserial PRIMARY KEY,
entity_type text NOT NULL,
entity_key text NOT NULL,
event_type text NOT NULL,
payload jsonb NOT NULL,
status text NOT NULL DEFAULT 'NEW',
created_at timestamptz NOT NULL DEFAULT now()
)`

// TestDropInOrderedOnSeed003Table: a seed-003-style table (one key column,
// statuses NEW, DONE, FAILED) works through the drop-in script in ordered
// mode. The script creates the ordering index; four workers with small
// batches deliver every entity's events in order, the backlog and what
// producers write while the relay runs.
func TestDropInOrderedOnSeed003Table(t *testing.T) {
	t.Parallel()
	dbURL := testkit.NewDatabase(t)
	pool := testkit.NewPool(t, dbURL)
	testkit.Exec(t, pool, seed003Table)
	insert := func(from, to int) {
		testkit.Exec(t, pool, `INSERT INTO outbox (entity_type, entity_key, event_type, payload)
			SELECT 'account', 'acct-' || k, 'changed', jsonb_build_object('seq', s)
			FROM generate_series($1::int, $2::int) AS s, generate_series(1, 100) AS k ORDER BY s, k`, from, to)
	}
	insert(1, 10)
	vars := []string{"-v", "table=outbox", "-v", "id_column=id", "-v", "status_pending=NEW",
		"-v", "status_published=DONE", "-v", "status_failed=FAILED",
		"-v", "ordering=aggregate", "-v", "ordering_key=entity_key"}
	psql(t, dbURL, append(vars, "-f", "../../sql/outboxrelay_install.sql")...)
	require.Equal(t, int64(1), testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_indexes
		WHERE indexname = 'outbox_relay_ordering_idx' AND indexdef LIKE '%(entity_key, relay_seq)%' AND indexdef LIKE '%NEW%FAILED%'`))
	before := schemaOf(t, dbURL, "outbox")
	psql(t, dbURL, append(vars, "-f", "../../sql/outboxrelay_install.sql")...)
	require.Equal(t, before, schemaOf(t, dbURL, "outbox"), "running the install twice changes nothing")

	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "#")
	r := startRelay(t, relayEnv(dbURL, exchange), "--no-migrate", "--table=public.outbox",
		"--column-aggregate-type=entity_type", "--column-aggregate-id=entity_key",
		"--status-pending=NEW", "--status-published=DONE", "--status-failed=FAILED",
		"--ordering=aggregate", "--ordering-key=entity_key", "--workers=4", "--batch-size=30")
	c := testkit.NewOrderChecker()
	receive := func(want int) {
		deadline := time.After(60 * time.Second)
		for c.Unique() < want {
			select {
			case d := <-queue.Deliveries:
				c.Add(d)
			case <-deadline:
				t.Fatalf("%d of %d events arrived", c.Unique(), want)
			}
		}
		require.Empty(t, c.Violations)
	}
	receive(1000)
	insert(11, 15)
	receive(1500)
	testkit.WaitFor(t, 30*time.Second, "every row DONE in the table's vocabulary", func() bool {
		return testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE status = 'DONE'`) == 1500
	})
	r.Stop(60 * time.Second)

	psql(t, dbURL, "-v", "table=outbox", "-f", "../../sql/outboxrelay_uninstall.sql")
	require.Zero(t, testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_indexes WHERE indexname = 'outbox_relay_ordering_idx'`))
}
