package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Querier is what Cancel needs of the database: pgx.Tx, *pgx.Conn and
// *pgxpool.Pool have it, and so does anything that wraps them.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// SQLQuerier is what CancelSQL needs of the database: *sql.Tx, *sql.Conn
// and *sql.DB have it.
type SQLQuerier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Cancel deletes, through db, the scheduled events with these IDs (as
// Write returned them, or any form of the same UUIDs) that no
// relay has taken yet: pending, never attempted, held by no claim. It
// returns the IDs of those it deleted, in the canonical form Write returns,
// in the order given. Pass the transaction of the business change that
// cancels them, so that they are cancelled exactly when it commits.
//
// Cancel and the relay's claim lock the same row, so they never both win:
// an event Cancel deleted is not published (not even if the transaction
// commits after its time came: the relay skips a row a transaction holds),
// and an event a relay took first is not deleted and is not among the IDs
// returned, to be treated as published. An ID that names no such event
// (never written, already published or cancelled) is not returned either.
// Cancelling an event that is due works as well, if no relay has taken it
// yet.
//
// To reschedule an event, cancel it and Write it again with its new
// Event.NotBefore in the same transaction; its ID may be reused. It then
// comes after its aggregate's other events in ordered mode, as any new one.
//
// Cancel finds events through the partial index on the event id column of
// the pending rows, which the relay's migrations and drop-in SQL create;
// it uses the attempts and lease_id columns by those names.
func (w Writer) Cancel(ctx context.Context, db Querier, ids ...string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	stmt, list, given, err := w.cancel(ids)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, stmt, list)
	if err != nil {
		return nil, fmt.Errorf("outbox: cancel %d events in %s: %w", len(ids), w.table(), err)
	}
	deleted, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("outbox: cancel %d events in %s: %w", len(ids), w.table(), err)
	}
	return inOrder(given, deleted), nil
}

// CancelSQL is Cancel for database/sql.
func (w Writer) CancelSQL(ctx context.Context, db SQLQuerier, ids ...string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	stmt, list, given, err := w.cancel(ids)
	if err != nil {
		return nil, err
	}
	deleted, err := querySQLStrings(ctx, db, stmt, list)
	if err != nil {
		return nil, fmt.Errorf("outbox: cancel %d events in %s: %w", len(ids), w.table(), err)
	}
	return inOrder(given, deleted), nil
}

// querySQLStrings runs a statement that returns one text column and reads
// every row.
func querySQLStrings(ctx context.Context, db SQLQuerier, stmt string, args ...any) ([]string, error) {
	rows, err := db.QueryContext(ctx, stmt, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// inOrder is the IDs of given that are among got, in given's order, each
// once.
func inOrder(given, got []string) []string {
	in := make(map[string]bool, len(got))
	for _, id := range got {
		in[id] = true
	}
	var out []string
	for _, id := range given {
		if in[id] {
			out = append(out, id)
			delete(in, id)
		}
	}
	return out
}

// cancel validates ids and returns the delete, its one argument (the ids
// as an array literal) and the ids in canonical form. The parameter is
// left untyped, so PostgreSQL reads it as an array of the column's type
// (uuid or text) and the comparison can use the column's index. The
// delete returns the deleted rows' event ids as text.
func (w Writer) cancel(ids []string) (string, string, []string, error) {
	var list arrayBuilder
	given := make([]string, len(ids))
	for i, id := range ids {
		if id == "" {
			return "", "", nil, fmt.Errorf("%w: ids[%d]: empty", ErrInvalidEvent, i)
		}
		canonical, err := eventID(id)
		if err != nil {
			return "", "", nil, fmt.Errorf("%w: ids[%d]: %w", ErrInvalidEvent, i, err)
		}
		list.add(canonical, true)
		given[i] = canonical
	}
	table, err := w.tableIdentifier()
	if err != nil {
		return "", "", nil, err
	}
	eventID := cmp.Or(w.Columns.EventID, "event_id")
	status := cmp.Or(w.Columns.Status, "status")
	pending := cmp.Or(w.PendingStatus, "pending")
	for _, s := range []string{eventID, status, pending} {
		if err := checkText(s); err != nil {
			return "", "", nil, fmt.Errorf("outbox: Writer: %q: %w", s, err)
		}
	}
	// The pending status is spelt as a literal, so that the planner sees
	// the partial index's predicate in the statement.
	column := pgx.Identifier{eventID}.Sanitize()
	stmt := "DELETE FROM " + table.Sanitize() +
		" WHERE " + column + " = ANY ($1) AND " + pgx.Identifier{status}.Sanitize() + " = '" + strings.ReplaceAll(pending, "'", "''") + "'" +
		` AND "attempts" = 0 AND "lease_id" IS NULL RETURNING ` + column + "::text"
	return stmt, list.String(), given, nil
}
