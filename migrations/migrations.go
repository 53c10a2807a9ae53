// Package migrations holds the relay's versioned schema migrations, embedded
// in the binary, and applies them with tern.
//
// Migrations are tracked in the table outboxrelay_schema_version and applied
// under a PostgreSQL advisory lock, so several relays starting at once apply
// each migration exactly once. Objects are created in the first schema of the
// connection's search_path.
//
// Compatibility: Migrate, the version table and the schema the latest
// migration leaves (documented in docs/deployment.md) are the package's
// promise. A migration, once released, is never edited: a change to the
// schema is a new migration, and an upgrade keeps every row.
package migrations

import (
	"context"
	"embed"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/tern/v2/migrate"
)

// VersionTable records the applied schema version.
const VersionTable = "outboxrelay_schema_version"

//go:embed *.sql
var files embed.FS

// Migrate brings the schema reached through conn up to the latest version and
// returns the version it reached. It is safe to call concurrently from several
// processes and to call again when nothing is left to do. A nil logger
// discards the log.
func Migrate(ctx context.Context, conn *pgx.Conn, logger *slog.Logger) (int32, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m, err := newMigrator(ctx, conn)
	if err != nil {
		return 0, err
	}
	m.OnStart = func(seq int32, name, direction, _ string) {
		logger.Info("applying migration", "version", seq, "name", name, "direction", direction)
	}
	if err := m.Migrate(ctx); err != nil {
		return 0, fmt.Errorf("migrate: %w", err)
	}
	v, err := m.GetCurrentVersion(ctx)
	if err != nil {
		return 0, fmt.Errorf("migrate: read version: %w", err)
	}
	return v, nil
}

// newMigrator is a tern migrator of the embedded migrations on conn.
func newMigrator(ctx context.Context, conn *pgx.Conn) (*migrate.Migrator, error) {
	m, err := migrate.NewMigrator(ctx, conn, VersionTable)
	if err != nil {
		return nil, fmt.Errorf("migrate: version table: %w", err)
	}
	if err := m.LoadMigrations(files); err != nil {
		return nil, fmt.Errorf("migrate: load: %w", err)
	}
	return m, nil
}

// Latest is the version Migrate brings a schema to.
func Latest() (int32, error) {
	names, err := migrate.FindMigrations(files)
	if err != nil {
		return 0, fmt.Errorf("migrate: find: %w", err)
	}
	return int32(len(names)), nil
}
