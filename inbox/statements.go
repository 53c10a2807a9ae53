package inbox

import (
	"strings"

	"github.com/jackc/pgx/v5"
)

// The consumer's statements, with "inbox" standing for the table's quoted
// name. Values always go as parameters.
const (
	// markSQL is the hot path, the one statement the inbox adds to the
	// handler's transaction: it records the message as processed, or, when
	// the row exists already, takes its lock and marks it processed unless
	// it was. No row returned: processed already, a duplicate. The row lock
	// (of the insert, or of the update) is held until the transaction ends,
	// so a concurrent copy of the message waits here and then, re-checking
	// the WHERE against the committed row, finds it processed. It returns
	// the attempts that failed before this one.
	markSQL = `INSERT INTO "inbox" AS t (consumer, message_id, processed_at, updated_at)
VALUES ($1, $2, now(), now())
ON CONFLICT (consumer, message_id) DO UPDATE SET processed_at = now(), updated_at = now()
WHERE t.processed_at IS NULL
RETURNING t.attempts`

	// failSQL counts a failed attempt, on its own, after the handler's
	// transaction rolled back; it returns the attempts so far, or no row
	// when the message was processed meanwhile (by a concurrent copy).
	failSQL = `INSERT INTO "inbox" AS t (consumer, message_id, attempts, last_error, updated_at)
VALUES ($1, $2, 1, $3, now())
ON CONFLICT (consumer, message_id) DO UPDATE SET attempts = t.attempts + 1, last_error = excluded.last_error, updated_at = now()
WHERE t.processed_at IS NULL
RETURNING t.attempts`

	// resetSQL gives a dead-lettered message fresh attempts, once its
	// delivery was rejected, so that a copy moved back from the
	// dead-letter queue is tried again; last_error stays.
	resetSQL = `UPDATE "inbox" SET attempts = 0, updated_at = now()
WHERE consumer = $1 AND message_id = $2 AND processed_at IS NULL`

	// cleanupSQL deletes at most $3 of the consumer's records older than
	// the window ($2 seconds), by ctid, so each batch is one short
	// statement whatever the table's size.
	cleanupSQL = `DELETE FROM "inbox" WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM "inbox"
    WHERE consumer = $1 AND updated_at < now() - make_interval(secs => $2)
    LIMIT $3))`
)

// statements are the consumer's statements for its table.
type statements struct {
	mark, fail, reset, cleanup string
}

func newStatements(table pgx.Identifier) statements {
	r := tableNames(table)
	return statements{
		mark:    r.Replace(markSQL),
		fail:    r.Replace(failSQL),
		reset:   r.Replace(resetSQL),
		cleanup: r.Replace(cleanupSQL),
	}
}

// tableNames renders the module's SQL (the statements above and
// inbox.sql) for table: its quoted name in place of "inbox", and its
// index's, "<table>_updated_at_brin" in the table's schema, in place of
// "inbox_updated_at_brin".
func tableNames(table pgx.Identifier) *strings.Replacer {
	index := pgx.Identifier{table[len(table)-1] + "_updated_at_brin"}
	return strings.NewReplacer(
		`"inbox_updated_at_brin"`, index.Sanitize(),
		`"inbox"`, table.Sanitize(),
	)
}
