package claim_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// onePool is a pool of one connection to a fresh database.
func onePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testkit.NewDatabase(t))
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// A setting applies to its statement, a transaction's settings to the
// whole transaction, and neither outlives its transaction on the server
// connection: the pool has one connection, which every step shares.
func TestLocalSettingsLastOneTransaction(t *testing.T) {
	t.Parallel()
	pool := onePool(t)
	ctx := context.Background()
	local := claim.NewLocalSettings(pool, map[string]string{"statement_timeout": "150", "enable_seqscan": "off"})

	show := func(db claim.DB, name string) string {
		t.Helper()
		rows, err := db.Query(ctx, "SELECT current_setting($1)", name)
		require.NoError(t, err)
		v, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return v
	}
	require.Equal(t, "off", show(local, "enable_seqscan"))
	require.Equal(t, "150ms", show(local, "statement_timeout"))
	require.Equal(t, "on", show(pool, "enable_seqscan"), "nothing left on the connection")
	require.Equal(t, "0", show(pool, "statement_timeout"))

	_, err := local.Exec(ctx, "SELECT pg_sleep(5)")
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "%v", err)
	require.Equal(t, pgerrcode.QueryCanceled, pgErr.Code, "the statement timeout holds: %v", err)
	require.Equal(t, "on", show(pool, "enable_seqscan"), "the failed batch gave the connection back clean")

	tx, err := local.Begin(ctx)
	require.NoError(t, err)
	require.Equal(t, "off", show(tx, "enable_seqscan"))
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, "on", show(pool, "enable_seqscan"))
}

// Rows read to their end, or closed early, give the one connection back:
// otherwise the next statement would wait for it until the deadline.
func TestLocalSettingsRowsGiveTheConnectionBack(t *testing.T) {
	t.Parallel()
	pool := onePool(t)
	local := claim.NewLocalSettings(pool, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 3 {
		rows, err := local.Query(ctx, "SELECT generate_series(1, 3)")
		require.NoError(t, err)
		n := 0
		for rows.Next() {
			n++
		}
		require.NoError(t, rows.Err())
		require.Equal(t, 3, n)

		rows, err = local.Query(ctx, "SELECT generate_series(1, 3)")
		require.NoError(t, err)
		require.True(t, rows.Next())
		rows.Close()
		require.NoError(t, rows.Err())
	}
	require.EqualValues(t, 0, pool.Stat().AcquiredConns())
}

// pooledStore is a store on a pool through PgBouncer in transaction mode,
// configured as the relay configures it there.
func pooledStore(t *testing.T, directURL string, cfg claim.Config) (*pgxpool.Pool, *claim.Store) {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(testkit.NewPgBouncer(t, directURL))
	require.NoError(t, err)
	cfg.Pooled = true
	cfg.ConfigurePool(pcfg)
	pcfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, err := claim.New(pool, cfg)
	require.NoError(t, err)
	return pool, s
}

// Every statement of the store works through PgBouncer in transaction
// mode, MarkAndClaim's batch among them, unordered and ordered, many times over on four client connections
// that share server connections: a prepared statement or a startup
// parameter would fail here (PgBouncer 1.18 refuses the one and loses the
// other between transactions).
func TestPooledStoreWorksThroughPgBouncer(t *testing.T) {
	t.Parallel()
	for _, ordering := range []claim.Ordering{claim.OrderNone, claim.OrderAggregate} {
		t.Run(string(ordering), func(t *testing.T) {
			t.Parallel()
			url, direct := testkit.NewOutbox(t)
			ensureOrderingIndex(t, url)
			testkit.InsertEvents(t, direct, 200)
			_, s := pooledStore(t, url, claim.Config{Ordering: ordering, RetryMin: time.Millisecond, RetryMax: time.Millisecond})
			ctx := context.Background()
			require.NoError(t, s.Check(ctx))

			var (
				published int64
				marks     []int64 // for the next claim to mark
			)
			for round := 0; published < 200; round++ {
				require.Less(t, round, 1000, "the store stopped making progress")
				b, err := s.MarkAndClaim(ctx, marks, 10)
				require.NoError(t, err)
				published += int64(len(marks))
				marks = nil
				if len(b.Events) == 0 {
					continue // the retried event waits out its 1 ms
				}
				ids := make([]int64, len(b.Events))
				for i, e := range b.Events {
					ids[i] = e.ID
				}
				n, err := s.Extend(ctx, b.Lease, ids)
				require.NoError(t, err)
				require.EqualValues(t, len(ids), n)
				if round%3 == 1 && len(ids) >= 2 { // one attempt given back, one failed
					n, err := s.Release(ctx, b.Lease, ids[:1])
					require.NoError(t, err)
					require.EqualValues(t, 1, n)
					res, err := s.Retry(ctx, b.Lease, []claim.Failure{{ID: ids[1], Attempts: 1, Err: errors.New("boom")}})
					require.NoError(t, err)
					require.Len(t, res.Due, 1)
					ids = ids[2:]
				}
				if round%2 == 0 {
					marks = ids
					continue
				}
				n, err = s.MarkPublished(ctx, ids)
				require.NoError(t, err)
				published += n
			}
			sample, err := s.Sample(ctx, nil)
			require.NoError(t, err)
			require.Zero(t, sample.Pending)
			deleted, err := s.DeletePublished(ctx, time.Nanosecond, 1000)
			require.NoError(t, err)
			require.EqualValues(t, 200, deleted)
		})
	}
}

// The claim keeps to the index through PgBouncer, where no session
// setting can hold it there: the settings travel with the statement. The
// case is the one ConfigurePool's settings were made for: rows published
// one by one since the last vacuum, for which the planner, left alone,
// picks a bitmap scan (checked first on a plain connection).
func TestPooledClaimPlanStaysOnTheIndex(t *testing.T) {
	t.Parallel()
	url, setup := testkit.NewOutbox(t)
	publishedOneByOne(t, setup)

	_, s := pooledStore(t, url, claim.Config{})
	explain := "EXPLAIN (COSTS OFF) " + claim.Statements(s)["claim"]
	args := []any{500, 30000, claim.LeaseID{}, 16 << 20, 0, []int64{}}
	require.Contains(t, planOf(t, setup, explain, args...), "Bitmap", "the planner alone picks a bitmap scan")
	plan := planOf(t, claim.DBOf(s), explain, args...)
	require.Contains(t, plan, "Index Scan using outbox_pending_idx", plan)
	require.NotContains(t, plan, "Bitmap", plan)
	require.NotContains(t, plan, "Seq Scan", plan)
}
