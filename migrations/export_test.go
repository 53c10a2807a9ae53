package migrations

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// MigrateTo brings the schema to version v, which may be older than the
// latest: an upgrade test starts from it.
func MigrateTo(ctx context.Context, conn *pgx.Conn, v int32) error {
	m, err := newMigrator(ctx, conn)
	if err != nil {
		return err
	}
	return m.MigrateTo(ctx, v)
}

// Files are the embedded migrations.
var Files = files
