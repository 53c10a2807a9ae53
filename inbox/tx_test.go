package inbox_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/inbox"
)

// roundTrips is a pgx tracer that logs the queries and batches a pool
// sends, each as one line: "query(commit)", "batch(begin; INSERT)" (the
// first word of each statement).
type roundTrips struct {
	mu    sync.Mutex
	trips []string
}

func (r *roundTrips) add(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trips = append(r.trips, s)
}

func (r *roundTrips) log() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.trips...)
}

func firstWord(sql string) string { return strings.Fields(sql)[0] }

func (r *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	r.add("query(" + firstWord(data.SQL) + ")")
	return ctx
}

func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	words := make([]string, 0, data.Batch.Len())
	for _, q := range data.Batch.QueuedQueries {
		words = append(words, firstWord(q.SQL))
	}
	r.add("batch(" + strings.Join(words, "; ") + ")")
	return ctx
}

func (r *roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// The handler's transaction begins in the round trip that records the
// message: the inbox adds no round trip of its own to a message's
// (begin with the record, the handler's statements, commit).
func TestBeginAndRecordShareARoundTrip(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	trips := &roundTrips{}
	cfg := e.config("svc", func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		return e.insertEffect(ctx, tx, d.MessageId, "")
	})
	cfg.DB = newPool(t, sharedDatabaseURL, func(c *pgxpool.Config) { c.ConnConfig.Tracer = trips })
	cfg.CleanupInterval = -1
	e.start(cfg)
	e.publish("m1", "", nil)
	eventually(t, wait, func() bool { return e.metric("inbox_processed_total", nil) == 1 }, "not processed")
	require.Equal(t, []string{"batch(begin; INSERT)", "query(INSERT)", "query(commit)"}, trips.log())
	require.Equal(t, 1, e.effectsOf("m1"))
}

// Savepoints (tx.Begin) nest in the handler's transaction as in pgx's:
// rolled back, their statements are undone and the transaction goes on.
func TestSavepointsInTheHandlersTransaction(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	errs := make(chan error, 1)
	e.start(e.config("svc", func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		errs <- func() error {
			undone, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if err := e.insertEffect(ctx, undone, d.MessageId, "undone"); err != nil {
				return err
			}
			if err := undone.Rollback(ctx); err != nil {
				return err
			}
			outer, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if err := e.insertEffect(ctx, outer, d.MessageId, "outer"); err != nil {
				return err
			}
			inner, err := outer.Begin(ctx)
			if err != nil {
				return err
			}
			if err := e.insertEffect(ctx, inner, d.MessageId, "inner"); err != nil {
				return err
			}
			if err := inner.Commit(ctx); err != nil {
				return err
			}
			if err := outer.Commit(ctx); err != nil {
				return err
			}
			if _, err := outer.Exec(ctx, `SELECT 1`); !errors.Is(err, pgx.ErrTxClosed) {
				return errors.New("a released savepoint still runs statements")
			}
			return nil
		}()
		return nil
	}))
	e.publish("m1", "", nil)
	require.NoError(t, <-errs)
	eventually(t, wait, func() bool { return e.metric("inbox_processed_total", nil) == 1 }, "not processed")
	notes := e.count(`SELECT count(*) FROM `+pgx.Identifier{e.effects}.Sanitize()+` WHERE note = ANY($1)`, []string{"outer", "inner"})
	require.Equal(t, 2, notes)
	require.Equal(t, 2, e.effectsOf("m1"), "the rolled back savepoint's insert stayed")
}

// Once the handler returned and its transaction committed, the
// transaction refuses every statement (pgx.ErrTxClosed), so that a
// goroutine the handler left behind cannot write on the connection,
// which is back in the pool.
func TestTransactionEndsWithItsHandler(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	kept := make(chan pgx.Tx, 1)
	e.start(e.config("svc", func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		kept <- tx
		return e.insertEffect(ctx, tx, d.MessageId, "")
	}))
	e.publish("m1", "", nil)
	tx := <-kept
	eventually(t, wait, func() bool { return e.metric("inbox_processed_total", nil) == 1 }, "not processed")

	ctx := context.Background()
	require.ErrorIs(t, e.insertEffect(ctx, tx, "m1", "late"), pgx.ErrTxClosed)
	_, err := tx.Query(ctx, `SELECT 1`)
	require.ErrorIs(t, err, pgx.ErrTxClosed)
	require.ErrorIs(t, tx.QueryRow(ctx, `SELECT 1`).Scan(new(int)), pgx.ErrTxClosed)
	b := &pgx.Batch{}
	b.Queue(`SELECT 1`)
	require.ErrorIs(t, tx.SendBatch(ctx, b).Close(), pgx.ErrTxClosed)
	_, err = tx.CopyFrom(ctx, pgx.Identifier{e.effects}, []string{"message_id"}, pgx.CopyFromRows([][]any{{"m1"}}))
	require.ErrorIs(t, err, pgx.ErrTxClosed)
	_, err = tx.Prepare(ctx, "late", `SELECT 1`)
	require.ErrorIs(t, err, pgx.ErrTxClosed)
	_, err = tx.Begin(ctx)
	require.ErrorIs(t, err, pgx.ErrTxClosed)
	require.ErrorIs(t, tx.Commit(ctx), pgx.ErrTxClosed)
	require.ErrorIs(t, tx.Rollback(ctx), pgx.ErrTxClosed)
	require.Equal(t, 1, e.effectsOf("m1"))
}

// A handler that swallows a failed statement's error and returns nil
// leaves its transaction failed: the COMMIT rolls back, and that is the
// handler's failure, counted and retried; the message is not recorded
// as processed by the rolled-back transaction.
func TestSwallowedStatementErrorFailsTheAttempt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var got calls
	e.start(e.config("svc", func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		if got.add(d.MessageId) == 1 {
			_, _ = tx.Exec(ctx, `SELECT 1/0`) // swallowed
		}
		_ = e.insertEffect(ctx, tx, d.MessageId, "")
		return nil
	}))
	e.publish("m1", "", nil)
	eventually(t, wait, func() bool { return e.metric("inbox_processed_total", nil) == 1 }, "not processed")
	require.Equal(t, 2, got.of("m1"))
	require.Equal(t, 1, e.effectsOf("m1"))
	require.Equal(t, float64(1), e.metric("inbox_retried_total", nil))
	r, _ := e.record("svc", "m1")
	require.True(t, r.Processed)
	require.Equal(t, 1, r.Attempts)
}

// LargeObjects panics with ErrLargeObjects: pgx makes its LargeObjects
// for its own transactions only.
func TestLargeObjectsPanicsWithItsError(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	recovered := make(chan any, 1)
	e.start(e.config("svc", func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		defer func() { recovered <- recover() }()
		tx.LargeObjects()
		return nil
	}))
	e.publish("m1", "", nil)
	r := <-recovered
	err, _ := r.(error)
	require.ErrorIs(t, err, inbox.ErrLargeObjects, "recovered %v", r)
}

// A pool in pgx's simple protocol mode (as behind a PgBouncer that does
// not support prepared statements) sends BEGIN and the record as one
// query string, the message id as a literal pgx quotes: a hostile id is
// recorded as it is and its duplicate skipped.
func TestSimpleProtocolPool(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var got calls
	cfg := e.config("svc", func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		got.add(d.MessageId)
		return e.insertEffect(ctx, tx, d.MessageId, "")
	})
	cfg.DB = newPool(t, sharedDatabaseURL, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol })
	e.start(cfg)
	id := `m'1'); DROP TABLE x; --\`
	e.publish(id, "", nil)
	eventually(t, wait, func() bool { return e.metric("inbox_processed_total", nil) == 1 }, "not processed")
	e.publish(id, "", nil)
	eventually(t, wait, func() bool { return e.metric("inbox_duplicates_total", nil) == 1 }, "the duplicate not counted")
	require.Equal(t, 1, got.of(id))
	require.Equal(t, 1, e.effectsOf(id))
	r, ok := e.record("svc", id)
	require.True(t, ok)
	require.True(t, r.Processed)
}

// A duplicate leaves the connection's prepared statements alone. pgx drops
// the cached statements of a batch that fails, so the record's "no row"
// must not fail the batch: the next message would prepare BEGIN and the
// record again.
func TestDuplicateKeepsPreparedStatements(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := e.config("svc", func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		return e.insertEffect(ctx, tx, d.MessageId, "")
	})
	pool := newPool(t, sharedDatabaseURL, func(c *pgxpool.Config) { c.MaxConns = 1 }) // one connection: the consumer's and ours
	cfg.DB, cfg.CleanupInterval = pool, -1
	e.start(cfg)
	prepared := func() time.Time {
		var at time.Time
		require.NoError(t, pool.QueryRow(context.Background(),
			`SELECT prepare_time FROM pg_prepared_statements WHERE starts_with(statement, 'INSERT INTO ' || $1 || ' AS t')`,
			pgx.Identifier{e.table}.Sanitize()).Scan(&at))
		return at
	}

	e.publish("m1", "", nil)
	eventually(t, wait, func() bool { return e.metric("inbox_processed_total", nil) == 1 }, "m1 not processed")
	before := prepared()
	e.publish("m1", "", nil)
	eventually(t, wait, func() bool { return e.metric("inbox_duplicates_total", nil) == 1 }, "the duplicate not counted")
	e.publish("m2", "", nil)
	eventually(t, wait, func() bool { return e.metric("inbox_processed_total", nil) == 2 }, "m2 not processed")
	require.Equal(t, before, prepared(), "the record was prepared again after the duplicate")
}
