package testkit

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outboxrelay/internal/redact"
	"github.com/outboxrelay/outboxrelay/migrations"
	outboxsql "github.com/outboxrelay/outboxrelay/sql"
)

// NewOutbox creates a fresh database with the relay's migrations applied and
// returns its URL and a pool on it.
func NewOutbox(t testing.TB) (string, *pgxpool.Pool) {
	t.Helper()
	url := NewDatabase(t)
	Migrate(t, url)
	return url, NewPool(t, url)
}

// Migrate applies the relay's migrations to the database at url.
func Migrate(t testing.TB, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("testkit: connect: %v", redact.Error(err, url))
	}
	defer conn.Close(ctx)
	if _, err := migrations.Migrate(ctx, conn, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatalf("testkit: %v", err)
	}
}

// InsertEvents inserts n events for aggregate type "order" in one transaction.
func InsertEvents(t testing.TB, pool *pgxpool.Pool, n int) {
	t.Helper()
	Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', (i % 97)::text, 'created', jsonb_build_object('n', i)
		FROM generate_series(1, $1) AS i`, n)
}

// InstallOrdering adds the index ordered mode needs to the migrated outbox
// table at url, as a relay in ordered mode does at start-up: through the
// drop-in installation, which builds it concurrently.
func InstallOrdering(t testing.TB, url string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("testkit: connect: %v", redact.Error(err, url))
	}
	defer conn.Close(ctx)
	if err := migrations.Install(ctx, conn, MigratedTable(outboxsql.Settings{Ordering: "aggregate"}), nil); err != nil {
		t.Fatalf("testkit: %v", err)
	}
}

// MigratedTable fills s with the migrated outbox table's name, schema and
// columns, as the relay's start-up passes them to the installation.
func MigratedTable(s outboxsql.Settings) outboxsql.Settings {
	s.Table, s.Schema, s.IDColumn = "outbox", "public", "id"
	return s
}
