package outbox

import (
	"cmp"
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Cancel deletes, through db, the scheduled events with these IDs (as
// Write returned them, or any form of the same UUIDs) that no
// relay has taken yet: pending, never attempted, held by no claim. It
// returns how many it deleted. Pass the transaction of the business change
// that cancels them, so that they are cancelled exactly when it commits.
//
// Cancel and the relay's claim lock the same row, so they never both win:
// an event Cancel deleted is not published (not even if the transaction
// commits after its time came: the relay skips a row a transaction holds),
// and an event a relay took first is not deleted and counts 0, to be
// treated as published. An ID that names no such event (never written,
// already published or cancelled) counts 0 too. Cancelling an event that
// is due works as well, if no relay has taken it yet.
//
// To reschedule an event, cancel it and Write it again with its new
// Event.NotBefore in the same transaction; its ID may be reused. It then
// comes after its aggregate's other events in ordered mode, as any new one.
//
// Cancel finds events through the partial index on the event id column of
// the pending rows, which the relay's migrations and drop-in SQL create;
// it uses the attempts and lease_id columns by those names.
func (w Writer) Cancel(ctx context.Context, db Execer, ids ...string) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	stmt, list, err := w.cancel(ids)
	if err != nil {
		return 0, err
	}
	tag, err := db.Exec(ctx, stmt, list)
	if err != nil {
		return 0, fmt.Errorf("outbox: cancel %d events in %s: %w", len(ids), w.table(), err)
	}
	return tag.RowsAffected(), nil
}

// CancelSQL is Cancel for database/sql.
func (w Writer) CancelSQL(ctx context.Context, db SQLExecer, ids ...string) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	stmt, list, err := w.cancel(ids)
	if err != nil {
		return 0, err
	}
	res, err := db.ExecContext(ctx, stmt, list)
	if err != nil {
		return 0, fmt.Errorf("outbox: cancel %d events in %s: %w", len(ids), w.table(), err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("outbox: cancel %d events in %s: %w", len(ids), w.table(), err)
	}
	return n, nil
}

// cancel validates ids and returns the delete and its one argument, the
// ids as an array literal. The parameter is left untyped, so PostgreSQL
// reads it as an array of the column's type (uuid or text) and the
// comparison can use the column's index.
func (w Writer) cancel(ids []string) (string, string, error) {
	var list arrayBuilder
	for i, id := range ids {
		if id == "" {
			return "", "", fmt.Errorf("%w: ids[%d]: empty", ErrInvalidEvent, i)
		}
		canonical, err := eventID(id)
		if err != nil {
			return "", "", fmt.Errorf("%w: ids[%d]: %w", ErrInvalidEvent, i, err)
		}
		list.add(canonical, true)
	}
	table, err := w.tableIdentifier()
	if err != nil {
		return "", "", err
	}
	eventID := cmp.Or(w.Columns.EventID, "event_id")
	status := cmp.Or(w.Columns.Status, "status")
	pending := cmp.Or(w.PendingStatus, "pending")
	for _, s := range []string{eventID, status, pending} {
		if err := checkText(s); err != nil {
			return "", "", fmt.Errorf("outbox: Writer: %q: %w", s, err)
		}
	}
	// The pending status is spelt as a literal, so that the planner sees
	// the partial index's predicate in the statement.
	stmt := "DELETE FROM " + table.Sanitize() +
		" WHERE " + pgx.Identifier{eventID}.Sanitize() + " = ANY ($1) AND " + pgx.Identifier{status}.Sanitize() + " = '" + strings.ReplaceAll(pending, "'", "''") + "'" +
		` AND "attempts" = 0 AND "lease_id" IS NULL`
	return stmt, list.String(), nil
}
