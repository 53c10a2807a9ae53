package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/testkit"
)

// TestAConnectionTurnedReadOnlyIsDropped turns one pooled connection
// read-only, as fencing an old primary does
// (ALTER SYSTEM SET default_transaction_read_only = on, which every
// session is told of): once released, it must not be handed out again,
// or every write through it would fail with "cannot execute UPDATE in a
// read-only transaction".
func TestAConnectionTurnedReadOnlyIsDropped(t *testing.T) {
	t.Parallel()
	dbURL := testkit.NewDatabase(t)
	cfg, err := DatabaseFlags{DatabaseURL: dbURL + sep(dbURL) + "pool_max_conns=1"}.poolConfig(claim.Config{}, 1)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()

	pid := func(sql string) (pid uint32) {
		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		_, err = conn.Exec(ctx, sql)
		require.NoError(t, err)
		return conn.Conn().PgConn().PID()
	}
	first := pid("SELECT 1")
	require.Equal(t, first, pid("SELECT 1"), "a writable connection is reused")
	fenced := pid("SET default_transaction_read_only = on")
	require.Equal(t, first, fenced)
	next := pid("CREATE TABLE written (n int)")
	require.NotEqual(t, fenced, next, "the read-only connection was handed out again")
}

// sep is what joins one more query parameter to url.
func sep(url string) string {
	if strings.Contains(url, "?") {
		return "&"
	}
	return "?"
}
