package testkit_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, testkit.LeakOptions()...) }

// connect opens a connection to rawURL that keeps no prepared statements
// (pgx's exec mode), as a client of a transaction-pooling PgBouncer must;
// it is closed when the test ends.
func connect(t *testing.T, rawURL string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(rawURL)
	require.NoError(t, err)
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// The URL reaches the test's database, as its user, through PgBouncer's
// own port rather than PostgreSQL's.
func TestPgBouncerQuery(t *testing.T) {
	t.Parallel()
	dbURL := testkit.NewDatabase(t)
	bouncerURL := testkit.NewPgBouncer(t, dbURL)

	direct, err := url.Parse(dbURL)
	require.NoError(t, err)
	through, err := url.Parse(bouncerURL)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1", through.Hostname())
	require.NotEqual(t, direct.Port(), through.Port())
	require.Equal(t, direct.Path, through.Path)
	require.Equal(t, "disable", through.Query().Get("sslmode"))

	conn := connect(t, bouncerURL)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var database, user string
	var sum int
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_database(), current_user, $1::int + 1", 41).Scan(&database, &user, &sum))
	require.Equal(t, strings.TrimPrefix(direct.Path, "/"), database)
	require.Equal(t, direct.User.Username(), user)
	require.Equal(t, 42, sum)
}

// PgBouncer 1.18 refuses a startup parameter it does not track, as in
// production, while PostgreSQL itself takes the same URL.
func TestPgBouncerRefusesStatementTimeout(t *testing.T) {
	t.Parallel()
	dbURL := testkit.NewDatabase(t)
	bouncerURL := testkit.NewPgBouncer(t, dbURL)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	directConn := connect(t, dbURL+"&statement_timeout=5000")
	var timeout string
	require.NoError(t, directConn.QueryRow(ctx, "SHOW statement_timeout").Scan(&timeout))
	require.Equal(t, "5s", timeout)

	cfg, err := pgx.ParseConfig(bouncerURL + "&statement_timeout=5000")
	require.NoError(t, err)
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err == nil {
		conn.Close(ctx)
	}
	require.Error(t, err)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "want the server's error, got %v", err)
	require.Equal(t, "FATAL", pgErr.Severity)
	require.Equal(t, "08P01", pgErr.Code) // protocol_violation
	require.Equal(t, "unsupported startup parameter: statement_timeout", pgErr.Message)
}

// In transaction pooling a server connection belongs to a client only for
// one transaction: the server client A's autocommit query released is the
// one client B's transaction gets, and while B's transaction holds it, A's
// next query runs on another.
func TestPgBouncerTransactionPooling(t *testing.T) {
	t.Parallel()
	bouncerURL := testkit.NewPgBouncer(t, testkit.NewDatabase(t))
	a := connect(t, bouncerURL)
	b := connect(t, bouncerURL)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	var pidA, pidB, pidA2 int32
	require.NoError(t, a.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pidA))
	tx, err := b.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pidB))
	require.Equal(t, pidA, pidB, "client B's transaction should run on the server client A released")

	require.NoError(t, a.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pidA2))
	require.NotEqual(t, pidB, pidA2, "client A should not get the server B's open transaction holds")
	require.NoError(t, tx.Commit(ctx))
}
