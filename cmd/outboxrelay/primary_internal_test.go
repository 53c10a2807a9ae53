package main

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
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
	cfg, err := DatabaseFlags{DatabaseURL: testkit.WithParam(dbURL, "pool_max_conns=1")}.poolConfig(claim.Config{}, 1)
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

// TestRequirePrimaryReadsTheURLsSessionAttrs: the relay adds read-write
// where a URL asks for nothing or any server, keeps read-write and
// primary, and refuses the rest, in URL and keyword/value form alike.
func TestRequirePrimaryReadsTheURLsSessionAttrs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		url     string
		refused string // the value named in the error; "" when accepted
	}{
		{"postgres://h/db", ""},
		{"postgres://h1,h2/db?target_session_attrs=any", ""},
		{"postgres://h1,h2/db?sslmode=disable&target_session_attrs=read-write", ""},
		{"postgres://h1,h2/db?target_session_attrs=primary", ""},
		{"host=h1,h2 dbname=db target_session_attrs='read-write'", ""},
		{"postgres://h1,h2/db?target_session_attrs=standby", "standby"},
		{"postgres://h1,h2/db?target_session_attrs=prefer-standby&sslmode=disable", "prefer-standby"},
		{"host=h1,h2 target_session_attrs=read-only dbname=db", "read-only"},
	} {
		cfg, err := pgconn.ParseConfig(tc.url)
		require.NoError(t, err, tc.url)
		err = requirePrimary(cfg, tc.url, "--database-url")
		if tc.refused != "" {
			require.ErrorContains(t, err, "target_session_attrs="+tc.refused+": the relay writes", tc.url)
			continue
		}
		require.NoError(t, err, tc.url)
		require.NotNil(t, cfg.ValidateConnect, "%s: every connection is checked for writes", tc.url)
	}
}
