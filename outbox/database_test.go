package outbox_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The library's tests and examples run against a real PostgreSQL: each gets
// a database of its own, dropped when it ends, with the outbox table created
// by the relay's migrations. The library is a module of its own and uses
// nothing of the relay's code, so the migrations are read as files and
// applied here as the relay applies them: the schema is defined once.

// defaultPostgresURL is the admin database the tests create their databases
// from, as in the relay's tests.
const defaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// postgresURL is TEST_DATABASE_URL (the variable the relay's tests read),
// or defaultPostgresURL.
func postgresURL() string {
	return cmp.Or(os.Getenv("TEST_DATABASE_URL"), defaultPostgresURL)
}

// migrationsDir holds the relay's migrations, one file per migration, named
// "<number>_<name>.sql" and applied in the order of their numbers.
const migrationsDir = "../migrations"

var migrationFile = regexp.MustCompile(`\A(\d+)_.+\.sql\z`)

// uniqueName is prefix followed by an underscore and 12 random hex digits.
func uniqueName(prefix string) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return prefix + "_" + hex.EncodeToString(b[:])
}

// createDatabase creates an empty database and returns its URL and a
// function that drops it (with FORCE, so connections left open do not keep
// it).
func createDatabase(ctx context.Context) (string, func() error, error) {
	admin := postgresURL()
	u, err := url.Parse(admin)
	if err != nil {
		return "", nil, fmt.Errorf("parse TEST_DATABASE_URL: %w", err)
	}
	name := uniqueName("outbox_test")
	if err := adminExec(ctx, admin, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", nil, fmt.Errorf("create database %s: %w", name, err)
	}
	drop := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := adminExec(ctx, admin, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("drop database %s: %w", name, err)
		}
		return nil
	}
	u.Path = "/" + name
	return u.String(), drop, nil
}

// adminExec runs one statement on a connection of its own to the admin
// database.
func adminExec(ctx context.Context, admin, sql string) error {
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return err // pgx leaves the password out of its errors
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// migrate applies the relay's migrations to the empty database at
// databaseURL as the relay's migrator (tern) does, each in a transaction of
// its own, without tern's version table. tern can also render templates and
// run a migration outside a transaction; the relay's migrations use
// neither, and one that starts to is refused here rather than applied
// differently.
func migrate(ctx context.Context, databaseURL string) error {
	entries, err := os.ReadDir(migrationsDir)
	if err != nil {
		return fmt.Errorf("read the relay's migrations: %w", err)
	}
	type migration struct {
		number int
		name   string
	}
	var migrations []migration
	for _, e := range entries {
		m := migrationFile.FindStringSubmatch(e.Name())
		if e.IsDir() || m == nil {
			continue
		}
		n, err := strconv.Atoi(m[1])
		if err != nil {
			return fmt.Errorf("migration %s: %w", e.Name(), err)
		}
		migrations = append(migrations, migration{n, e.Name()})
	}
	if len(migrations) == 0 {
		return fmt.Errorf("no migrations in %s", migrationsDir)
	}
	slices.SortFunc(migrations, func(a, b migration) int { return cmp.Compare(a.number, b.number) })

	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return fmt.Errorf("connect to migrate: %w", err)
	}
	defer conn.Close(ctx)
	for i, m := range migrations {
		if m.number != i+1 {
			return fmt.Errorf("migration %s: want number %d (tern numbers them from 1, without gaps)", m.name, i+1)
		}
		body, err := os.ReadFile(filepath.Join(migrationsDir, m.name))
		if err != nil {
			return fmt.Errorf("migration %s: %w", m.name, err)
		}
		up, _, _ := strings.Cut(string(body), "---- create above / drop below ----")
		if strings.Contains(up, "{{") || strings.Contains(up, "---- tern: disable-tx ----") {
			return fmt.Errorf("migration %s: uses a tern template or disable-tx, which these tests do not apply; teach migrate in database_test.go", m.name)
		}
		if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, up)
			return err
		}); err != nil {
			return fmt.Errorf("migration %s: %w", m.name, err)
		}
	}
	return nil
}

// newDatabase creates an empty database for this test, dropped when the
// test ends, and returns its URL.
func newDatabase(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	databaseURL, drop, err := createDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := drop(); err != nil {
			t.Error(err)
		}
	})
	return databaseURL
}

// newOutbox creates a database for this test with the relay's migrations
// applied, and returns its URL and a pool on it.
func newOutbox(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	databaseURL := newDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := migrate(ctx, databaseURL); err != nil {
		t.Fatal(err)
	}
	return databaseURL, newPool(t, databaseURL)
}

// newPool opens a pool on databaseURL, closed when the test ends.
func newPool(t *testing.T, databaseURL string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), databaseURL)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// openSQL opens a database/sql handle on databaseURL through pgx's stdlib
// driver, closed when the test ends.
func openSQL(t *testing.T, databaseURL string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", databaseURL)
	if err != nil {
		t.Fatalf("database/sql: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// execSQL runs sql on pool and fails the test on error.
func execSQL(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pool.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("exec %q: %v", sql, err)
	}
}

// queryInt runs a query returning one integer and fails the test on error.
func queryInt(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var n int64
	if err := pool.QueryRow(ctx, sql, args...).Scan(&n); err != nil {
		t.Fatalf("query %q: %v", sql, err)
	}
	return n
}
