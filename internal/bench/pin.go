package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// pinApp is the application_name of the connection that pins the horizon.
const pinApp = "outboxrelay-bench-pin"

// pinTimeouts are the settings that would end a transaction left idle,
// each turned off on the pinning session where the server has it (the
// database's, the role's or the URL's default may set one):
// transaction_timeout is PostgreSQL 17's.
var pinTimeouts = []string{"idle_in_transaction_session_timeout", "transaction_timeout"}

// pin is a REPEATABLE READ transaction that has taken its snapshot and is
// left open, idle in transaction: until it ends, vacuum removes no row
// version that died after the snapshot was taken, in any table of the
// cluster, and every index entry of such a version stays in its index.
type pin struct {
	conn *pgx.Conn
	tx   pgx.Tx
	pid  uint32
}

// pinHorizon opens a connection of its own, turns off the timeouts that
// would end its transaction, begins a REPEATABLE READ transaction and
// counts the outbox's rows in it, which takes the snapshot it keeps.
func (d *database) pinHorizon(ctx context.Context) (_ *pin, err error) {
	connectCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	conn, err := pgx.Connect(connectCtx, d.url(pinApp))
	if err != nil {
		return nil, fmt.Errorf("pin the horizon: connect: %w", err)
	}
	p := &pin{conn: conn, pid: conn.PgConn().PID()}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	qctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var present []string
	if err := conn.QueryRow(qctx, `SELECT coalesce(array_agg(name), '{}') FROM pg_settings WHERE name = ANY ($1)`, pinTimeouts).Scan(&present); err != nil {
		return nil, fmt.Errorf("pin the horizon: read settings: %w", err)
	}
	for _, name := range present {
		if _, err := conn.Exec(qctx, `SELECT set_config($1, '0', false)`, name); err != nil {
			return nil, fmt.Errorf("pin the horizon: turn off %s: %w", name, err)
		}
	}
	if p.tx, err = conn.BeginTx(qctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}); err != nil {
		return nil, fmt.Errorf("pin the horizon: begin: %w", err)
	}
	var rows int64
	if err := p.tx.QueryRow(qctx, "SELECT count(*) FROM "+d.table).Scan(&rows); err != nil {
		return nil, fmt.Errorf("pin the horizon: count: %w", err)
	}
	return p, nil
}

// holds checks, through the benchmark's pool, that the pinning session is
// still idle in its transaction with its snapshot's xmin, and returns the
// horizon's age in transactions.
func (p *pin) holds(ctx context.Context, d *database) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var state *string
	var age *int64
	err := d.pool.QueryRow(ctx, `SELECT state, age(backend_xmin)::bigint FROM pg_stat_activity WHERE pid = $1`, int64(p.pid)).Scan(&state, &age)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, fmt.Errorf("the horizon's pin: its session (pid %d) is gone", p.pid)
	case err != nil:
		return 0, fmt.Errorf("the horizon's pin: %w", err)
	case state == nil || *state != "idle in transaction" || age == nil:
		return 0, fmt.Errorf("the horizon's pin: its session (pid %d) is %s, without a snapshot: the horizon is not held", p.pid, deref(state))
	}
	return *age, nil
}

// release commits the transaction: a commit that fails means the
// transaction ended earlier, and the horizon was not held throughout.
func (p *pin) release(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	if err := p.tx.Commit(ctx); err != nil {
		return fmt.Errorf("the horizon's pin: commit: %w", err)
	}
	return nil
}

// close ends the transaction if it is still open and closes the
// connection; the pin's locks must go before the schema can be dropped.
func (p *pin) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if p.tx != nil {
		p.tx.Rollback(ctx) // after a commit, a no-op
	}
	p.conn.Close(ctx)
}

func deref(s *string) string {
	if s == nil {
		return "unknown"
	}
	return *s
}
