package inbox

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// schemaSQL is the drop-in file inbox.sql, for the table "inbox".
//
//go:embed inbox.sql
var schemaSQL string

// Migrate creates the inbox table (and its index) if they do not exist:
// the statements of the drop-in file inbox.sql, with the table named table
// ("" = "inbox"; "schema.table" is allowed, the schema must exist). It is
// idempotent: call it at every start, or run inbox.sql in your own
// migrations instead. db may be a pool, a connection or a transaction.
func Migrate(ctx context.Context, db Execer, table string) error {
	id, err := tableIdentifier(table)
	if err != nil {
		return fmt.Errorf("inbox: migrate: table %w", err)
	}
	if _, err := db.Exec(ctx, SchemaSQL(id)); err != nil {
		return fmt.Errorf("inbox: migrate %s: %w", id.Sanitize(), err)
	}
	return nil
}

// SchemaSQL returns the statements Migrate runs for table: inbox.sql with
// the table's name (and its index's, "<table>_updated_at_brin" in the
// table's schema) in place of "inbox".
func SchemaSQL(table pgx.Identifier) string {
	return tableNames(table).Replace(schemaSQL)
}
