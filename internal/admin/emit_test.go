package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/admin"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// hookedDB is an admin.DB on a pool whose Exec goes through exec, which
// the test writes; Query and Begin are the pool's.
type hookedDB struct {
	*pgxpool.Pool
	exec func(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

func (d hookedDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return d.exec(ctx, sql, args...)
}

func TestEmitWithoutOptionsInsertsOneDemoEvent(t *testing.T) {
	t.Parallel()
	a, pool, _ := newAdmin(t, claim.Config{})
	n, err := a.Emit(context.Background(), admin.EmitOptions{})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Equal(t, int64(1), testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox`))
	require.Equal(t, int64(1), testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox
		WHERE aggregate_type = 'demo' AND aggregate_id = '1' AND event_type = 'emitted'
		AND payload = '{"demo": true, "n": 1}' AND exchange IS NULL AND routing_key IS NULL`))
}

func TestEmitFillsEveryColumnItIsGiven(t *testing.T) {
	t.Parallel()
	a, pool, _ := newAdmin(t, claim.Config{})
	n, err := a.Emit(context.Background(), admin.EmitOptions{Count: 3, AggregateType: "order", AggregateID: "42",
		EventType: "created", Payload: json.RawMessage(`{"x": [1, 2]}`), Exchange: "ex", RoutingKey: "rk"})
	require.NoError(t, err)
	require.Equal(t, int64(3), n)
	require.Equal(t, int64(3), testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox
		WHERE aggregate_type = 'order' AND aggregate_id = '42' AND event_type = 'created'
		AND payload = '{"x": [1, 2]}' AND exchange = 'ex' AND routing_key = 'rk'`))
	require.Equal(t, int64(3), testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox`))
}

// Every event of one Emit has a number of its own, 1 to Count, in its
// default aggregate id and payload, across the statements a large Count
// takes.
func TestEmitNumbersEachEvent(t *testing.T) {
	t.Parallel()
	a, pool, _ := newAdmin(t, claim.Config{})
	n, err := a.Emit(context.Background(), admin.EmitOptions{Count: 2500})
	require.NoError(t, err)
	require.Equal(t, int64(2500), n)
	require.Equal(t, int64(2500), testkit.QueryInt(t, pool, `SELECT count(DISTINCT aggregate_id) FROM outbox
		WHERE aggregate_id::int BETWEEN 1 AND 2500 AND payload->>'n' = aggregate_id`))
}

// A large Count is inserted a thousand events per statement, so no
// statement holds the table's locks and its WAL for long.
func TestEmitWritesALargeCountInStatementsOfAThousand(t *testing.T) {
	t.Parallel()
	_, pool, _ := newAdmin(t, claim.Config{})
	var ranges [][2]int64 // each insert's first and last sequence number
	db := hookedDB{Pool: pool, exec: func(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
		ranges = append(ranges, [2]int64{args[6].(int64), args[7].(int64)})
		return pool.Exec(ctx, sql, args...)
	}}
	a, err := admin.New(db, claim.Config{})
	require.NoError(t, err)
	n, err := a.Emit(context.Background(), admin.EmitOptions{Count: 2500})
	require.NoError(t, err)
	require.Equal(t, int64(2500), n)
	require.Equal(t, [][2]int64{{1, 1000}, {1001, 2000}, {2001, 2500}}, ranges)
	require.Equal(t, int64(2500), testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox`))
}

// With a Rate, the events are spread over time: six at 20 a second take a
// quarter of a second (the first goes at once, the sixth is due after 250
// ms), where without a Rate they would all go at once.
func TestEmitAtARateSpreadsTheEvents(t *testing.T) {
	t.Parallel()
	a, pool, _ := newAdmin(t, claim.Config{})
	start := time.Now()
	n, err := a.Emit(context.Background(), admin.EmitOptions{Count: 6, Rate: 20})
	require.NoError(t, err)
	require.Equal(t, int64(6), n)
	require.GreaterOrEqual(t, time.Since(start), 250*time.Millisecond, "six events at 20/s take a quarter second")
	require.Equal(t, int64(6), testkit.QueryInt(t, pool, `SELECT count(DISTINCT payload->>'n') FROM outbox`))
}

// Without a Count, a Rate inserts until ctx ends, and says how many it
// inserted, with ctx's error.
func TestEmitAtARateWithoutACountRunsUntilCanceled(t *testing.T) {
	t.Parallel()
	a, pool, _ := newAdmin(t, claim.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		n   int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := a.Emit(ctx, admin.EmitOptions{Rate: 200})
		done <- result{n, err}
	}()
	testkit.WaitFor(t, 30*time.Second, "twenty events", func() bool {
		return testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox`) >= 20
	})
	cancel()
	res := <-done
	require.ErrorIs(t, res.err, context.Canceled)
	require.Equal(t, testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox`), res.n)
}

// heldEmit is how an Emit canceled during its second insert ended.
type heldEmit struct {
	n        int64 // what Emit returned
	err      error
	calls    int   // the inserts Emit started
	heldLast int64 // the last sequence number of the insert held
}

// emitCanceledDuringSecondInsert runs Emit at rate on pool with its second
// insert held until the test has canceled ctx. With refuseLate, an insert
// started after that one is refused instead of written.
func emitCanceledDuringSecondInsert(t *testing.T, pool *pgxpool.Pool, rate float64, refuseLate bool) heldEmit {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu  sync.Mutex
		got heldEmit
	)
	underWay := make(chan struct{})
	db := hookedDB{Pool: pool, exec: func(execCtx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
		mu.Lock()
		got.calls++
		second, late := got.calls == 2, got.calls > 2
		if second {
			got.heldLast = args[7].(int64)
		}
		mu.Unlock()
		if late && refuseLate { // refused, not written: the chunks due could take minutes
			return pgconn.CommandTag{}, errors.New("an insert started after ctx ended")
		}
		if second {
			close(underWay)
			<-ctx.Done()
		}
		return pool.Exec(execCtx, sql, args...)
	}}
	a, err := admin.New(db, claim.Config{})
	require.NoError(t, err)
	type result struct {
		n   int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := a.Emit(ctx, admin.EmitOptions{Rate: rate})
		done <- result{n, err}
	}()
	select {
	case <-underWay:
	case <-time.After(30 * time.Second):
		t.Fatal("no second insert within 30s")
	}
	cancel()
	res := <-done
	mu.Lock()
	defer mu.Unlock()
	got.n, got.err = res.n, res.err
	return got
}

// An insert under way when ctx ends is finished, and counted: what Emit
// reports is what was committed. The second insert here is held until the
// test has canceled ctx.
func TestEmitFinishesTheInsertUnderWayWhenCanceled(t *testing.T) {
	t.Parallel()
	_, pool, _ := newAdmin(t, claim.Config{})
	res := emitCanceledDuringSecondInsert(t, pool, 50, false)
	require.ErrorIs(t, res.err, context.Canceled)
	require.Equal(t, res.heldLast, res.n, "the insert under way was not finished and counted: %v", res.err)
	require.Equal(t, res.n, testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox`))
}

// Once ctx ended, Emit starts no insert. At a million events a second
// each tick makes many chunks due at once; the second insert is held
// until the test has canceled ctx, and the chunks due after it are not
// written.
func TestEmitStartsNoInsertOnceCanceled(t *testing.T) {
	t.Parallel()
	_, pool, _ := newAdmin(t, claim.Config{})
	res := emitCanceledDuringSecondInsert(t, pool, 1e6, true)
	require.ErrorIs(t, res.err, context.Canceled)
	require.Equal(t, 2, res.calls)
	require.Equal(t, res.heldLast, res.n)
	require.Equal(t, res.n, testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox`))
}

func TestEmitRefusesBadOptions(t *testing.T) {
	t.Parallel()
	a, pool, _ := newAdmin(t, claim.Config{})
	for _, tc := range []struct {
		name string
		opt  admin.EmitOptions
		want string
	}{
		{"payload not JSON", admin.EmitOptions{Payload: json.RawMessage(`{nope`)}, "Payload"},
		{"negative count", admin.EmitOptions{Count: -1}, "Count -1"},
		{"negative rate", admin.EmitOptions{Rate: -1}, "Rate -1"},
	} {
		n, err := a.Emit(context.Background(), tc.opt)
		require.ErrorContains(t, err, tc.want, tc.name)
		require.Zero(t, n, tc.name)
	}
	require.Zero(t, testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox`), "a refused Emit inserted events")
}
