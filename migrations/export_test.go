package migrations

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/tern/v2/migrate"
)

// MigrateTo brings the schema to version v, which may be older than the
// latest: an upgrade test starts from it.
func MigrateTo(ctx context.Context, conn *pgx.Conn, v int32) error {
	m, err := migrate.NewMigrator(ctx, conn, VersionTable)
	if err != nil {
		return err
	}
	if err := m.LoadMigrations(files); err != nil {
		return err
	}
	return m.MigrateTo(ctx, v)
}
