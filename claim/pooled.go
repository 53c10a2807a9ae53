package claim

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Conn is what LocalSettings needs of a connection or pool: *pgxpool.Pool
// and *pgx.Conn have it.
type Conn interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	Begin(ctx context.Context) (pgx.Tx, error)
}

// LocalSettings runs every statement under settings that last for that
// statement's transaction only: it sends set_config(name, value, true) for
// each setting and then the statement in one batch, which pgx sends in one
// round trip with one Sync, so both run in one implicit transaction and
// the statement is planned after the settings apply. Nothing outlives the
// transaction on the server connection, which is what a transaction-mode
// pooler such as PgBouncer requires: it hands the server connection to
// another client after every transaction, and settings made for a whole
// session (startup parameters, SET) would either be refused or leak to
// that client.
type LocalSettings struct {
	db   Conn
	sql  string
	args []any
}

// NewLocalSettings returns db with settings applied to each statement.
// Names must be PostgreSQL settings; they are sent as parameters, never
// spliced into SQL.
func NewLocalSettings(db Conn, settings map[string]string) *LocalSettings {
	names := slices.Sorted(maps.Keys(settings))
	calls := make([]string, len(names))
	args := make([]any, 0, 2*len(names))
	for i, name := range names {
		calls[i] = fmt.Sprintf("set_config($%d, $%d, true)", 2*i+1, 2*i+2)
		args = append(args, name, settings[name])
	}
	sql := "SELECT 1"
	if len(calls) > 0 {
		sql = "SELECT " + strings.Join(calls, ", ")
	}
	return &LocalSettings{db: db, sql: sql, args: args}
}

// batch queues the settings, then sql.
func (l *LocalSettings) batch(sql string, args []any) *pgx.Batch {
	b := &pgx.Batch{}
	l.queue(b)
	b.Queue(sql, args...)
	return b
}

// queue queues the settings on b, for the statements queued after them;
// their result is the batch's first.
func (l *LocalSettings) queue(b *pgx.Batch) { b.Queue(l.sql, l.args...) }

// Exec runs sql under the settings.
func (l *LocalSettings) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	br := l.db.SendBatch(ctx, l.batch(sql, args))
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// Query runs sql under the settings. The rows hold the connection until
// they are closed, as a pool's rows do.
func (l *LocalSettings) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	br := l.db.SendBatch(ctx, l.batch(sql, args))
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// Begin starts a transaction and applies the settings in it, for its
// whole length.
func (l *LocalSettings) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := l.db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, l.sql, l.args...); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	return tx, nil
}

// batchRows are the rows of a batch's last statement: closing them, or
// reading past the last row, closes the batch, which gives the pool its
// connection back and reports the batch's error.
type batchRows struct {
	pgx.Rows
	br  pgx.BatchResults
	err error
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	r.Rows.Close()
	if r.br != nil {
		if err := r.br.Close(); err != nil && r.err == nil {
			r.err = err
		}
		r.br = nil
	}
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}
