package main_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// readOnly makes the test database dbURL read-only for the sessions that
// start from now on, as a standby is to a relay: every new connection
// finds transaction_read_only on. The change is made from the admin
// database, since the test database's own sessions could not undo it.
func readOnly(t *testing.T, dbURL string, on bool) {
	t.Helper()
	cfg, err := pgx.ParseConfig(dbURL)
	require.NoError(t, err)
	admin := testkit.NewPool(t, testkit.PostgresURL())
	stmt := "ALTER DATABASE " + pgx.Identifier{cfg.Database}.Sanitize() + " RESET default_transaction_read_only"
	if on {
		stmt = "ALTER DATABASE " + pgx.Identifier{cfg.Database}.Sanitize() + " SET default_transaction_read_only = on"
	}
	testkit.Exec(t, admin, stmt)
}

// multiHost is dbURL behind a first host that refuses connections, with a
// password the logs must not show (trust auth ignores it): what a relay
// is given in front of a primary and its standby.
func multiHost(t *testing.T, dbURL string) string {
	t.Helper()
	u := strings.Replace(dbURL, "postgres://postgres@", "postgres://postgres:s3cret@127.0.0.1:1,", 1)
	require.NotEqual(t, dbURL, u, "a test database URL of the form postgres://postgres@host/db")
	return u
}

// TestRelayStartedWithNoPrimaryWaitsForOne starts a relay whose only
// answering server is read-only, as during a failover: it must neither
// exit nor write, but wait, say so, and migrate and relay once the server
// takes writes.
func TestRelayStartedWithNoPrimaryWaitsForOne(t *testing.T) {
	t.Parallel()
	dbURL := testkit.NewDatabase(t)
	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "#")
	readOnly(t, dbURL, true)
	p := startRelay(t, relayEnv(multiHost(t, dbURL), exchange))
	for range 2 { // it goes on waiting
		before := strings.Count(p.Out.String(), "waiting for a primary")
		testkit.WaitFor(t, 30*time.Second, "the relay to say it waits for a primary", func() bool {
			return strings.Count(p.Out.String(), "waiting for a primary") > before
		})
	}
	select {
	case <-p.Done():
		t.Fatalf("the relay exited while it should wait: %v\n%s", p.Err(), p.Out)
	default:
	}
	readOnly(t, dbURL, false)
	pool := testkit.NewPool(t, dbURL)
	testkit.WaitFor(t, 30*time.Second, "the relay to migrate once the server takes writes", func() bool {
		var table *string
		return pool.QueryRow(context.Background(), `SELECT to_regclass('outbox')::text`).Scan(&table) == nil && table != nil
	})
	testkit.InsertEvents(t, pool, 3)
	queue.Receive(t, 3, 30*time.Second)
	p.Stop(30 * time.Second)
	require.NotContains(t, p.Out.String(), "s3cret")
}
