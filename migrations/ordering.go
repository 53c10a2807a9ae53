package migrations

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// OrderingIndex is the name of the index ordered claims walk on the
// migrated outbox table.
const OrderingIndex = "outbox_ordering_idx"

// EnsureOrderingIndex creates the index ordered mode needs on the migrated
// outbox table, unless it exists: key (the ordering key's columns) then id,
// over the rows that can hold an aggregate back (pending and failed). It is
// not a numbered migration because only ordered mode needs it, and every
// producer pays for an index on each insert: an unordered relay's producers
// do not. It is built CONCURRENTLY, so producers keep writing while it is;
// a build that failed half-way (an invalid index) is dropped and built
// again. Relays starting together build it one at a time (see lockOrdering).
func EnsureOrderingIndex(ctx context.Context, conn *pgx.Conn, key []string, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	unlock, err := lockOrdering(ctx, conn)
	if err != nil {
		return err
	}
	defer unlock()
	var valid *bool
	err = conn.QueryRow(ctx, `SELECT i.indisvalid FROM pg_index AS i
		WHERE i.indexrelid = to_regclass(quote_ident(current_schema()) || '.' || $1)`, OrderingIndex).Scan(&valid)
	switch {
	case err == nil && valid != nil && *valid:
		return nil
	case err == nil:
		logger.Warn("dropping an ordering index whose build failed", "index", OrderingIndex)
		if _, err := conn.Exec(ctx, "DROP INDEX CONCURRENTLY IF EXISTS "+pgx.Identifier{OrderingIndex}.Sanitize()); err != nil {
			return fmt.Errorf("migrate: drop invalid ordering index: %w", err)
		}
	case err != pgx.ErrNoRows:
		return fmt.Errorf("migrate: look up ordering index: %w", err)
	}
	names := slices.Concat(key, []string{"id"})
	cols := make([]string, len(names))
	for i, c := range names {
		cols[i] = pgx.Identifier{c}.Sanitize()
	}
	logger.Info("creating the ordering index", "index", OrderingIndex, "columns", strings.Join(names, ", "))
	sql := fmt.Sprintf("CREATE INDEX CONCURRENTLY IF NOT EXISTS %s ON outbox (%s) WHERE status IN ('pending', 'failed')",
		pgx.Identifier{OrderingIndex}.Sanitize(), strings.Join(cols, ", "))
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("migrate: create ordering index: %w", err)
	}
	return nil
}

// orderingLock is the advisory lock key under which one relay at a time
// looks at and builds the ordering index.
const orderingLock = 1868722809

// lockOrdering takes the session advisory lock orderingLock, polling with
// pg_try_advisory_lock. Two relays building the index at once deadlock (and
// one would take the other's build in progress for a failed one and drop
// it); and a relay blocked in pg_advisory_lock would deadlock as well, for
// CREATE INDEX CONCURRENTLY waits for the snapshot of every session in a
// statement, the waiting one included. Between tries no statement runs.
func lockOrdering(ctx context.Context, conn *pgx.Conn) (unlock func(), err error) {
	for {
		var got bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", orderingLock).Scan(&got); err != nil {
			return nil, fmt.Errorf("migrate: lock for the ordering index: %w", err)
		}
		if got {
			return func() {
				_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", orderingLock)
			}, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("migrate: lock for the ordering index: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
