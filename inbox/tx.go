package inbox

import (
	"context"
	"errors"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// tx is the pgx.Tx a handler gets: a transaction on one connection,
// begun by the batch that also records the message, so that BEGIN and the
// record travel in one round trip (pgx's Begin sends BEGIN on its own, and
// offers no way to add a statement to it).
//
// It behaves as pgx's transaction does: Begin makes a savepoint (a tx of
// its own, Commit releases it, Rollback rolls back to it); Commit sends
// COMMIT and returns pgx.ErrTxCommitRollback when the server rolled back
// instead; a failed COMMIT or ROLLBACK closes the connection; once ended,
// every method returns pgx.ErrTxClosed. LargeObjects is the exception: see
// there.
type tx struct {
	// Tx is nil. pgx adds methods to its interfaces in minor releases
	// (Rows.TypeMap and BatchResults.Tx came after v5.7); a method added to
	// Tx after this module's pgx reaches the nil Tx and panics, where
	// implementing the interface alone would stop the module compiling
	// with that pgx.
	pgx.Tx

	conn      *pgx.Conn
	root      *tx   // the transaction; t itself unless t is a savepoint
	savepoint int64 // the savepoint's number; 0 for the transaction
	last      int64 // the transaction's last savepoint number
	closed    bool
}

// beginSQL is the statement that begins the handler's transaction, in
// the batch with the record.
const beginSQL = "begin"

// begin begins a transaction on conn with the statement that records the
// message, markSQL (rendered in mark) with args, in one round trip, and
// returns it with the failed attempts markSQL returns. The error is
// pgx.ErrNoRows when the message was processed already. The transaction
// is returned whatever the error: the caller rolls it back.
func begin(ctx context.Context, conn *pgx.Conn, mark string, args ...any) (*tx, int, error) {
	var attempts int
	found := true
	b := &pgx.Batch{}
	b.Queue(beginSQL)
	b.Queue(mark, args...).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&attempts)
		if errors.Is(err, pgx.ErrNoRows) {
			// Not the batch's error: pgx drops the cached statements of a
			// batch that fails, and would prepare them again.
			found = false
			return nil
		}
		return err
	})
	t := &tx{conn: conn}
	t.root = t
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return t, 0, err
	}
	if !found {
		return t, 0, pgx.ErrNoRows
	}
	return t, attempts, nil
}

func (t *tx) ended() bool { return t.closed || t.root.closed }

// Begin makes a savepoint.
func (t *tx) Begin(ctx context.Context) (pgx.Tx, error) {
	if t.ended() {
		return nil, pgx.ErrTxClosed
	}
	t.root.last++
	n := t.root.last
	if _, err := t.conn.Exec(ctx, "savepoint sp_"+strconv.FormatInt(n, 10)); err != nil {
		return nil, err
	}
	return &tx{conn: t.conn, root: t.root, savepoint: n}, nil
}

// Commit commits the transaction, or releases the savepoint.
func (t *tx) Commit(ctx context.Context) error {
	if t.ended() {
		return pgx.ErrTxClosed
	}
	t.closed = true
	if t.savepoint != 0 {
		_, err := t.conn.Exec(ctx, "release savepoint sp_"+strconv.FormatInt(t.savepoint, 10))
		return err
	}
	tag, err := t.conn.Exec(ctx, "commit")
	if err != nil {
		if t.conn.PgConn().TxStatus() != 'I' {
			_ = t.conn.Close(ctx) // the error says more than Close's
		}
		return err
	}
	if tag.String() == "ROLLBACK" {
		return pgx.ErrTxCommitRollback
	}
	return nil
}

// Rollback rolls the transaction back, or back to the savepoint.
func (t *tx) Rollback(ctx context.Context) error {
	if t.ended() {
		return pgx.ErrTxClosed
	}
	t.closed = true
	if t.savepoint != 0 {
		_, err := t.conn.Exec(ctx, "rollback to savepoint sp_"+strconv.FormatInt(t.savepoint, 10))
		return err
	}
	if _, err := t.conn.Exec(ctx, "rollback"); err != nil {
		// The connection's state is unknown: it must not be used again.
		_ = t.conn.Close(ctx)
		return err
	}
	return nil
}

func (t *tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if t.ended() {
		return pgconn.CommandTag{}, pgx.ErrTxClosed
	}
	return t.conn.Exec(ctx, sql, args...)
}

func (t *tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if t.ended() {
		return closedRows{}, pgx.ErrTxClosed
	}
	return t.conn.Query(ctx, sql, args...)
}

func (t *tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.ended() {
		return closedRows{}
	}
	return t.conn.QueryRow(ctx, sql, args...)
}

func (t *tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if t.ended() {
		return 0, pgx.ErrTxClosed
	}
	return t.conn.CopyFrom(ctx, table, columns, src)
}

func (t *tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.ended() {
		return closedBatch{}
	}
	return t.conn.SendBatch(ctx, b)
}

func (t *tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if t.ended() {
		return nil, pgx.ErrTxClosed
	}
	return t.conn.Prepare(ctx, name, sql)
}

// Conn returns the transaction's connection.
func (t *tx) Conn() *pgx.Conn { return t.conn }

// ErrLargeObjects is what the handler's transaction panics with when
// LargeObjects is called (the handler fails with a *PanicError holding
// it): pgx.LargeObjects can only be made by pgx's own transactions. Call
// the server's large object functions (lo_create, lo_put, lo_get, ...)
// with Exec and QueryRow instead.
var ErrLargeObjects = errors.New("inbox: the handler's transaction has no LargeObjects; call lo_create, lo_put, lo_get and the other large object functions with Exec or QueryRow")

// LargeObjects panics with ErrLargeObjects.
func (t *tx) LargeObjects() pgx.LargeObjects { panic(ErrLargeObjects) }

// closedRows are the rows, and the row, of a query on an ended
// transaction: no rows, and pgx.ErrTxClosed.
type closedRows struct {
	pgx.Rows // nil, for the methods pgx adds later, as tx's Tx
}

func (closedRows) Close()                                       {}
func (closedRows) Err() error                                   { return pgx.ErrTxClosed }
func (closedRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (closedRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (closedRows) Next() bool                                   { return false }
func (closedRows) Scan(...any) error                            { return pgx.ErrTxClosed }
func (closedRows) Values() ([]any, error)                       { return nil, pgx.ErrTxClosed }
func (closedRows) RawValues() [][]byte                          { return nil }
func (closedRows) Conn() *pgx.Conn                              { return nil }
func (closedRows) TypeMap() *pgtype.Map                         { return nil }

// closedBatch is the result of a batch sent on an ended transaction.
type closedBatch struct {
	pgx.BatchResults // nil, for the methods pgx adds later, as tx's Tx
}

func (closedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, pgx.ErrTxClosed }
func (closedBatch) Query() (pgx.Rows, error)         { return closedRows{}, pgx.ErrTxClosed }
func (closedBatch) QueryRow() pgx.Row                { return closedRows{} }
func (closedBatch) Close() error                     { return pgx.ErrTxClosed }
func (closedBatch) Tx() pgx.Tx                       { return nil }
