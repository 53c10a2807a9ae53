package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// insertTimeout bounds one producer INSERT.
const insertTimeout = 30 * time.Second

// producers are connections that write events the way an application
// would: one INSERT per autocommit transaction.
type producers struct {
	conns    []*pgx.Conn
	sql      string
	payloads payloads
}

// connectProducers opens n producer connections.
func (d *database) connectProducers(ctx context.Context, n int, p payloads) (*producers, error) {
	ps := &producers{
		sql: `INSERT INTO ` + d.table + ` (event_id, aggregate_type, aggregate_id, event_type, payload)
			VALUES ($1::uuid, '` + aggregateType + `', $2, '` + eventType + `', $3::jsonb)`,
		payloads: p,
	}
	cfg, err := pgx.ParseConfig(d.url("outboxrelay-bench-producer"))
	if err != nil {
		return nil, fmt.Errorf("producers: %w", err)
	}
	for range n {
		connectCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
		conn, err := pgx.ConnectConfig(connectCtx, cfg)
		cancel()
		if err != nil {
			ps.Close()
			return nil, fmt.Errorf("producers: connect: %w", err)
		}
		ps.conns = append(ps.conns, conn)
	}
	return ps, nil
}

// size is how many connections there are.
func (ps *producers) size() int { return len(ps.conns) }

// Close closes every connection.
func (ps *producers) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range ps.conns {
		c.Close(ctx)
	}
}

// insert writes event n, an aggregate of its own, on conn and returns when
// its commit has returned.
func (ps *producers) insert(ctx context.Context, conn *pgx.Conn, n int64) error {
	return ps.write(ctx, conn, n, strconv.FormatInt(n, 10), ps.payloads.of(n))
}

// insertSlot writes slot i of rec on conn: for a shaped record, as the
// event of its aggregate and seq (see Shape).
func (ps *producers) insertSlot(ctx context.Context, conn *pgx.Conn, rec *record, i int) error {
	n := rec.number(i)
	if rec.aggregates() == 0 {
		return ps.insert(ctx, conn, n)
	}
	l := rec.placeAt(i)
	return ps.write(ctx, conn, n, strconv.FormatInt(l.aggregate, 10), ps.payloads.withSeq(n, l.seq))
}

func (ps *producers) write(ctx context.Context, conn *pgx.Conn, n int64, aggregateID, payload string) error {
	ctx, cancel := context.WithTimeout(ctx, insertTimeout)
	defer cancel()
	if _, err := conn.Exec(ctx, ps.sql, eventID(n), aggregateID, payload); err != nil {
		return fmt.Errorf("insert event %d: %w", n, err)
	}
	return nil
}

// paced writes every event of rec over the first k connections at rate
// events per second, open loop: slot i is due at start + i/rate, connection
// w writes slots w, w+k, …, and a connection that falls behind writes its
// next event at once instead of waiting. A shaped record's aggregates are
// a multiple of k, so each aggregate is written by one connection, in seq
// order, as ordered mode asks of producers. Each commit is noted in rec. It
// returns how many events committed and the time from start until the last
// producer finished.
func (ps *producers) paced(ctx context.Context, k int, rec *record, clk clock, rate float64) (int64, time.Duration, error) {
	return ps.pacedUntil(ctx, k, rec, clk, rate, nil)
}

// pacedUntil is paced that also ends, without an error, once stop is
// closed (nil: never), each connection after the write it is in.
func (ps *producers) pacedUntil(ctx context.Context, k int, rec *record, clk clock, rate float64, stop <-chan struct{}) (int64, time.Duration, error) {
	due := func(i int) time.Duration { return time.Duration(float64(i) * float64(time.Second) / rate) }
	return ps.scheduled(ctx, k, rec, clk, due, stop)
}

// scheduled is pacedUntil with slot i due at start + due(i), due growing
// with i: a rate that changes over the run.
func (ps *producers) scheduled(ctx context.Context, k int, rec *record, clk clock, due func(i int) time.Duration, stop <-chan struct{}) (int64, time.Duration, error) {
	if a := rec.aggregates(); a%k != 0 {
		panic(fmt.Sprintf("bench: %d aggregates over %d producers: some aggregate would have two", a, k))
	}
	var committed atomic.Int64
	start := time.Now()
	err := onSchedule(ctx, k, rec.size(), start, due, stop, func(ctx context.Context, w, i int) error {
		if err := ps.insertSlot(ctx, ps.conns[w], rec, i); err != nil {
			return err
		}
		rec.commit(i, clk.now())
		committed.Add(1)
		return nil
	})
	return committed.Load(), time.Since(start), err
}

// onSchedule runs f for slots 0 … size-1 on k workers at once, worker w
// the slots w, w+k, …, each at start + due(i) or at once if its worker is
// late. A worker ends, without an error, once stop is closed (nil: never),
// after the slot it is in; the first error cancels the others.
func onSchedule(ctx context.Context, k, size int, start time.Time, due func(i int) time.Duration, stop <-chan struct{}, f func(ctx context.Context, w, i int) error) error {
	return fanOut(ctx, k, func(ctx context.Context, w int) error {
		timer := time.NewTimer(time.Hour)
		timer.Stop()
		defer timer.Stop()
		for i := w; i < size; i += k {
			if wait := time.Until(start.Add(due(i))); wait > 0 {
				timer.Reset(wait)
				select {
				case <-timer.C:
				case <-stop:
					return nil
				case <-ctx.Done():
					return context.Cause(ctx)
				}
			}
			select {
			case <-stop:
				return nil
			default:
			}
			if err := f(ctx, w, i); err != nil {
				return err
			}
		}
		return nil
	})
}

// flat inserts as fast as the first k connections can for d, numbering
// events from ids, and returns how many rows were inserted and the time
// until the last insert returned.
func (ps *producers) flat(ctx context.Context, k int, d time.Duration, ids *atomic.Int64) (int64, time.Duration, error) {
	var inserted atomic.Int64
	start := time.Now()
	end := start.Add(d)
	err := fanOut(ctx, k, func(ctx context.Context, w int) error {
		for time.Now().Before(end) {
			if err := ps.insert(ctx, ps.conns[w], ids.Add(1)-1); err != nil {
				return err
			}
			inserted.Add(1)
		}
		return nil
	})
	return inserted.Load(), time.Since(start), err
}

// fanOut runs f for workers 0 … k-1 at once and returns the first error,
// cancelling the others' context when one fails.
func fanOut(ctx context.Context, k int, f func(ctx context.Context, w int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	for w := range k {
		wg.Go(func() {
			if err := f(ctx, w); err != nil {
				cancel(err)
			}
		})
	}
	wg.Wait()
	return context.Cause(ctx)
}
