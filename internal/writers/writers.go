// Package writers finds the transactions writing to a table: every
// transaction that holds the table's ROW EXCLUSIVE lock, which an INSERT,
// UPDATE or DELETE takes when it starts (before it evaluates a default
// such as the id's nextval) and keeps to its transaction's end; and the
// transactions that have drawn from a sequence, which nextval locks the
// same way (ROW EXCLUSIVE on the sequence, taken before it hands out a
// value, kept to the transaction's end). The gate waits for a table's
// writers when it opens, and the claim store for those that drew from its
// insert sequence before it moves its frontier: once the transactions seen
// at some moment have all ended, every row they wrote is committed (and
// visible to a new snapshot) or rolled back.
package writers

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Querier runs a query; a *pgxpool.Pool and a *pgx.Conn have it.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Select lists the virtual transaction ids holding the table's ROW
// EXCLUSIVE lock in the current database, as one text array; $1 is the
// table (regclass text), and a statement that embeds it passes the table
// as $1. pg_locks is readable by every role.
const Select = `SELECT coalesce(array_agg(DISTINCT virtualtransaction), '{}') FROM pg_locks
	WHERE locktype = 'relation' AND mode = 'RowExclusiveLock' AND relation = $1::regclass
	  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`

// Drawing lists the virtual transaction ids that have drawn from the
// sequence $1 (regclass text) and not yet ended, in the current database,
// as one text array: the inserts of a table whose column defaults to the
// sequence, and not its other writers (a DELETE, an UPDATE, a SELECT ...
// FOR UPDATE take no lock on it). Reading the sequence's last value
// (pg_sequence_last_value) takes the same lock for its statement: the
// statement's own is left out, another reader's counts until its statement
// ends. A statement that embeds it passes the sequence as $1.
const Drawing = `SELECT coalesce(array_agg(DISTINCT virtualtransaction), '{}') FROM pg_locks
	WHERE locktype = 'relation' AND mode = 'RowExclusiveLock' AND relation = $1::regclass
	  AND pid <> pg_backend_pid()
	  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`

// SQL is Select; $2, if not null, keeps only the transactions it lists.
const SQL = Select + `
	  AND ($2::text[] IS NULL OR virtualtransaction = ANY ($2::text[]))`

// Of returns the transactions writing to table now; with among non-nil,
// only those of among still writing. table is a quoted, optionally
// schema-qualified name.
func Of(ctx context.Context, db Querier, table string, among []string) ([]string, error) {
	rows, err := db.Query(ctx, SQL, table, among)
	var out []string
	if err == nil {
		out, err = pgx.CollectExactlyOneRow(rows, pgx.RowTo[[]string])
	}
	if err != nil {
		return nil, fmt.Errorf("writers of %s: %w", table, err)
	}
	return out, nil
}
