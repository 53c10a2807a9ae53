package testkit

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outboxrelay/internal/redact"
)

// DefaultPostgresURL is the admin database the suite creates its databases from.
const DefaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// PostgresURL is TEST_DATABASE_URL, or DefaultPostgresURL.
func PostgresURL() string {
	return cmp.Or(os.Getenv("TEST_DATABASE_URL"), DefaultPostgresURL)
}

// UniqueName returns prefix followed by an underscore and 12 random hex digits,
// usable as a database, exchange or queue name.
func UniqueName(prefix string) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return prefix + "_" + hex.EncodeToString(b[:])
}

// NewDatabase creates an empty database for this test and returns its URL.
// The database is dropped (with FORCE) when the test ends. Notifications are
// scoped to a database, so tests on separate databases never wake each other.
func NewDatabase(t testing.TB) string {
	t.Helper()
	name := UniqueName("outboxrelay_test")
	admin := PostgresURL()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("testkit: connect to %s: %v", redact.URL(admin), err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("testkit: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("testkit: connect to drop %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("testkit: drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatalf("testkit: parse %s: %v", redact.URL(admin), err)
	}
	u.Path = "/" + name
	return u.String()
}

// WithParam is the URL databaseURL with one more query parameter, given
// as name=value.
func WithParam(databaseURL, param string) string {
	if strings.Contains(databaseURL, "?") {
		return databaseURL + "&" + param
	}
	return databaseURL + "?" + param
}

// NewPool opens a pool on databaseURL that is closed when the test ends.
func NewPool(t testing.TB, databaseURL string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		t.Fatalf("testkit: pool: %v", redact.Error(err, databaseURL))
	}
	t.Cleanup(pool.Close)
	return pool
}

// NewPoolOf is NewPool with room for conns connections: enough for that
// many goroutines to hold one each at once.
func NewPoolOf(t testing.TB, databaseURL string, conns int) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		t.Fatalf("testkit: pool: %v", redact.Error(err, databaseURL))
	}
	cfg.MaxConns = int32(conns)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("testkit: pool: %v", redact.Error(err, databaseURL))
	}
	t.Cleanup(pool.Close)
	return pool
}

// Exec runs sql on the pool and fails the test on error.
func Exec(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := pool.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("testkit: exec %q: %v", sql, err)
	}
}

// QueryInt runs a query returning one integer and fails the test on error.
func QueryInt(t testing.TB, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var n int64
	if err := pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		t.Fatalf("testkit: query %q: %v", sql, err)
	}
	return n
}
