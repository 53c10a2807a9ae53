package migrations

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrTransactionPooled is RequireSession's error for a connection that a
// transaction-mode pooler shares.
var ErrTransactionPooled = errors.New("the connection goes through a transaction-mode pooler " +
	"(PgBouncer pool_mode=transaction): migrations take a session advisory lock, so they need a direct " +
	"connection or a session-mode pool")

const backendPIDSQL = `SELECT pg_backend_pid()`

// RequireSession proves that conn keeps its server connection from one
// transaction to the next, as the session advisory lock Migrate and
// EnsureOrderingIndex take needs: through a transaction-mode pooler the
// lock would stay behind on a server connection another client gets next,
// and the unlock would go elsewhere. It returns ErrTransactionPooled if
// not.
//
// It opens a second connection with conn's configuration and asks both
// for their backend's pid, conn first, outside a transaction, then the
// second inside one. A direct connection and a session-mode pool give each
// client a server connection of its own, so the pids differ. A
// transaction-mode pooler hands conn's server connection back to its pool
// once the first statement ends, and PgBouncer gives the most recently
// released one out first: the second connection's transaction gets it, and
// the pids agree. Both statements run unprepared, as a pooled connection
// needs.
func RequireSession(ctx context.Context, conn *pgx.Conn) error {
	var first, second int32
	if err := conn.QueryRow(ctx, backendPIDSQL, pgx.QueryExecModeExec).Scan(&first); err != nil {
		return fmt.Errorf("check session: %w", err)
	}
	other, err := pgx.ConnectConfig(ctx, conn.Config())
	if err != nil {
		return fmt.Errorf("check session: second connection: %w", err)
	}
	defer other.Close(context.WithoutCancel(ctx))
	err = pgx.BeginFunc(ctx, other, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, backendPIDSQL, pgx.QueryExecModeExec).Scan(&second)
	})
	if err != nil {
		return fmt.Errorf("check session: %w", err)
	}
	if first == second {
		return ErrTransactionPooled
	}
	return nil
}
