package migrations

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/internal/lockkey"
	outboxsql "github.com/outboxrelay/outboxrelay/sql"
)

// setupLock is the session advisory lock (one bigint key) under which one
// process at a time runs Install, its concurrent index builds included;
// the install block takes it for its transaction too, so a psql run of
// sql/outboxrelay_install.sql waits as well.
const setupLock = lockkey.Setup

// Install makes the table s names ready for the relay: it runs the drop-in
// installation (sql/outboxrelay_install.sql, through
// outboxsql.InstallStatement) with s, which adds only what the table lacks
// and updates the trigger where s changes it (its channel, say). The
// indexes it finds missing are built CONCURRENTLY after its transaction, so
// producers keep writing while they are; one whose earlier build failed
// half-way (an invalid index) is dropped and built again. Processes
// installing at once do it one at a time (see lockSetup). Every field of s
// left empty takes the script's default; s.Table is required.
func Install(ctx context.Context, conn *pgx.Conn, s outboxsql.Settings, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	unlock, err := lockSetup(ctx, conn)
	if err != nil {
		return err
	}
	defer unlock()

	var deferred []string // index statements, to run CONCURRENTLY
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `CREATE TEMP TABLE outboxrelay_deferred_indexes
			(n serial, statement text) ON COMMIT DROP`); err != nil {
			return err
		}
		for _, v := range s.Vars() {
			if _, err := tx.Exec(ctx, `SELECT set_config('outboxrelay.' || $1, $2, true)`, v[0], v[1]); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, outboxsql.InstallStatement()); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT statement FROM pg_temp.outboxrelay_deferred_indexes ORDER BY n`)
		if err != nil {
			return err
		}
		deferred, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return err
	})
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	for _, stmt := range deferred {
		logger.Info("building an index", "statement", stmt)
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("install: %s: %w", stmt, err)
		}
	}
	return nil
}

// lockSetup takes the session advisory lock setupLock, polling with
// pg_try_advisory_lock. Two processes building an index at once deadlock
// (and one would take the other's build in progress for a failed one and
// drop it); and a process blocked in pg_advisory_lock would deadlock as
// well, for CREATE INDEX CONCURRENTLY waits for the snapshot of every
// session in a statement, the waiting one included. Between tries no
// statement runs.
func lockSetup(ctx context.Context, conn *pgx.Conn) (unlock func(), err error) {
	for {
		var got bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", setupLock).Scan(&got); err != nil {
			return nil, fmt.Errorf("install: lock: %w", err)
		}
		if got {
			return func() {
				_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", setupLock)
			}, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("install: lock: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
