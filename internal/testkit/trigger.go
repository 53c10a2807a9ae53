package testkit

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// TriggerCalls runs insert in a transaction of its own and returns how many
// times it called the outbox trigger function outboxrelay_notify(), as
// PostgreSQL counts it for the transaction (track_functions, which the
// tests' superuser may set for one transaction).
func TriggerCalls(t testing.TB, pool *pgxpool.Pool, insert string) int64 {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	_, err = tx.Exec(ctx, "SET LOCAL track_functions = 'pl'")
	require.NoError(t, err)
	// The "xact" counter holds what the backend has not yet reported to
	// the statistics (PostgreSQL 15 reports at most once a second): calls
	// of an earlier transaction on this connection may be in it too.
	calls := func() (n int64) {
		require.NoError(t, tx.QueryRow(ctx,
			`SELECT coalesce(pg_stat_get_xact_function_calls('outboxrelay_notify'::regproc), 0)`).Scan(&n))
		return n
	}
	before := calls()
	_, err = tx.Exec(ctx, insert)
	require.NoError(t, err)
	n := calls() - before
	require.NoError(t, tx.Commit(ctx))
	return n
}
