package inbox_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/inbox"
)

// BenchmarkConsumer compares the inbox Consumer with a plain amqp091
// consumer doing the same work (a counter row's upsert, in a transaction
// of its own, acked after the commit), both at prefetch 32, on b.N
// persistent messages published to a fresh queue beforehand. A third
// consumer, plain+select, is the plain one with one trivial statement
// (SELECT $1::text of the message id) before the work: a statement and a
// round trip more, without the inbox's record. Reported:
// messages/s, and the CPU milliseconds per 1,000 messages of this process
// (rusage) and of the PostgreSQL backends of the benchmark's database
// (/proc/<pid>/stat; PostgreSQL runs on this machine), their sum, and the
// WAL bytes per message (of the whole server: run it alone).
//
// -count repeats each sub-benchmark back to back; to interleave them, the
// benchmark runs -rounds rounds (default 3) of plain, plain+select and
// inbox instead:
//
//	go test -run '^$' -bench Consumer -benchtime 20000x
func BenchmarkConsumer(b *testing.B) {
	ctx := context.Background()
	databaseURL, drop, err := createDatabase(ctx)
	require.NoError(b, err)
	b.Cleanup(func() { require.NoError(b, drop()) })
	cfg, err := pgxpool.ParseConfig(databaseURL)
	require.NoError(b, err)
	cfg.MaxConns, cfg.MinConns = 34, 34
	commits := &commitCounter{}
	cfg.ConnConfig.Tracer = commits
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	require.NoError(b, inbox.Migrate(ctx, pool, ""))
	_, err = pool.Exec(ctx, `CREATE TABLE counters (k int PRIMARY KEY, n bigint NOT NULL)`)
	require.NoError(b, err)
	warm(b, pool, int(cfg.MaxConns))
	for round := 1; round <= *benchRounds; round++ {
		for _, kind := range []string{"plain", "plain+select", "inbox"} {
			b.Run(fmt.Sprintf("round=%d/%s", round, kind), func(b *testing.B) { benchConsume(b, pool, commits, kind) })
		}
	}
}

// benchRounds is how many rounds of (plain, plain+select, inbox)
// BenchmarkConsumer runs.
var benchRounds = flag.Int("rounds", 3, "BenchmarkConsumer's rounds of plain, plain+select and inbox")

// benchWork is both consumers' handler: a counter row's upsert.
func benchWork(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
	k, err := strconv.Atoi(string(d.Body))
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO counters (k, n) VALUES ($1, 1) ON CONFLICT (k) DO UPDATE SET n = counters.n + 1`, k%1000)
	return err
}

// benchConsume consumes b.N messages with the plain consumer or the inbox
// and reports the figures.
func benchConsume(b *testing.B, pool *pgxpool.Pool, commits *commitCounter, kind string) {
	queue := benchQueue(b, b.N)
	cpu := startCPU(b, pool)
	wal := walPosition(b, pool)
	done := commits.expect(int64(b.N))
	b.ResetTimer()
	start := time.Now()
	var stop func() error
	switch kind {
	case "plain":
		stop = runPlain(b, queue, pool, benchWork)
	case "plain+select":
		stop = runPlain(b, queue, pool, func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
			if _, err := tx.Exec(ctx, `SELECT $1::text`, d.MessageId); err != nil {
				return err
			}
			return benchWork(ctx, tx, d)
		})
	default:
		c, err := inbox.New(inbox.Config{
			AMQPURL: amqpURL(), Queue: queue, Name: "bench", DB: pool, Handler: benchWork,
			Prefetch: 32, CleanupInterval: -1,
		})
		require.NoError(b, err)
		stop = startConsumer(b, c)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Minute):
		b.Fatalf("%d of %d messages processed in 10 minutes", commits.count(), b.N)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	goCPU, pgCPU := cpu()
	walBytes := walSince(b, pool, wal)
	require.NoError(b, stop())
	n := float64(b.N)
	b.ReportMetric(n/elapsed.Seconds(), "msgs/s")
	b.ReportMetric(goCPU.Seconds()*1e3/n*1e3, "go-cpu-ms/1k")
	b.ReportMetric(pgCPU.Seconds()*1e3/n*1e3, "pg-cpu-ms/1k")
	b.ReportMetric((goCPU+pgCPU).Seconds()*1e3/n*1e3, "cpu-ms/1k")
	b.ReportMetric(walBytes/n, "wal-B/msg")
}

// commitCounter counts the commits on the benchmark's pool (a pgx query
// tracer) and closes done once target of them succeeded: the end of a
// benchmark, for every consumer.
type commitCounter struct {
	mu        sync.Mutex
	target    int64
	committed int64
	done      chan struct{}
}

// expect resets the counter to wait for target commits, and returns the
// channel closed once they happened.
func (c *commitCounter) expect(target int64) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.target, c.committed, c.done = target, 0, make(chan struct{})
	return c.done
}

// count returns the commits since the last expect.
func (c *commitCounter) count() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.committed
}

func (c *commitCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (c *commitCounter) TraceQueryEnd(_ context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	if data.Err != nil || data.CommandTag.String() != "COMMIT" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.committed++; c.committed == c.target {
		close(c.done)
	}
}

// runPlain consumes queue with amqp091 alone: for each delivery, a
// transaction running work, the commit, then the ack. It returns a stop.
func runPlain(b *testing.B, queue string, db *pgxpool.Pool, work inbox.Handler) func() error {
	conn, err := amqp.Dial(amqpURL())
	require.NoError(b, err)
	ch, err := conn.Channel()
	require.NoError(b, err)
	require.NoError(b, ch.Qos(32, 0, false))
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	require.NoError(b, err)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for d := range deliveries {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx := context.Background()
				err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return work(ctx, tx, d) })
				if err != nil {
					_ = d.Nack(false, true)
					return
				}
				_ = d.Ack(false)
			}()
		}
	}()
	return func() error {
		_ = conn.Close()
		wg.Wait()
		return nil
	}
}

// benchQueue declares a fresh queue (with a dead-letter exchange) holding
// n persistent messages with ids, deleted when the benchmark ends.
func benchQueue(b *testing.B, n int) string {
	ctx := context.Background()
	conn, err := amqp.Dial(amqpURL())
	require.NoError(b, err)
	b.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(b, err)
	queue := uniqueName("inbox-bench")
	require.NoError(b, ch.ExchangeDeclare(queue+"-dlx", "fanout", false, true, false, false, nil))
	_, err = ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-dead-letter-exchange": queue + "-dlx"})
	require.NoError(b, err)
	b.Cleanup(func() {
		_, _ = ch.QueueDelete(queue, false, false, false)
		_ = ch.ExchangeDelete(queue+"-dlx", false, false)
	})
	require.NoError(b, ch.Confirm(false))
	run := uniqueName("m")
	const window = 1000
	pending := make([]*amqp.DeferredConfirmation, 0, window)
	flush := func() {
		for _, dc := range pending {
			ok, err := dc.WaitContext(ctx)
			require.NoError(b, err)
			require.True(b, ok)
		}
		pending = pending[:0]
	}
	for i := range n {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
			MessageId: fmt.Sprint(run, "-", i), DeliveryMode: amqp.Persistent, Body: []byte(strconv.Itoa(i)),
		})
		require.NoError(b, err)
		if pending = append(pending, dc); len(pending) == window {
			flush()
		}
	}
	flush()
	return queue
}

// warm opens n connections in pool at once, so that no benchmark pays for
// connecting.
func warm(b *testing.B, pool *pgxpool.Pool, n int) {
	conns := make([]*pgxpool.Conn, n)
	for i := range conns {
		c, err := pool.Acquire(context.Background())
		require.NoError(b, err)
		conns[i] = c
	}
	for _, c := range conns {
		c.Release()
	}
}

// startCPU returns a function that returns the CPU time this process and
// the PostgreSQL backends of pool's database used since startCPU.
func startCPU(b *testing.B, pool *pgxpool.Pool) func() (goCPU, pgCPU time.Duration) {
	goStart := processCPU(b)
	pgStart := backendsCPU(b, pool)
	return func() (time.Duration, time.Duration) {
		var pg time.Duration
		for pid, t := range backendsCPU(b, pool) {
			pg += t - pgStart[pid] // a backend started since counts whole
		}
		return processCPU(b) - goStart, pg
	}
}

func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// clockTick is Linux's USER_HZ, the unit of /proc/<pid>/stat's times.
const clockTick = 10 * time.Millisecond

// backendsCPU returns the CPU time (user and system) of each backend of
// pool's database, by pid.
func backendsCPU(b *testing.B, pool *pgxpool.Pool) map[int]time.Duration {
	rows, err := pool.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE datname = current_database()`)
	require.NoError(b, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(b, err)
	cpu := make(map[int]time.Duration, len(pids))
	for _, pid := range pids {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // ended since
		}
		// Fields after the command's closing parenthesis: state is field 3,
		// utime 14 and stime 15.
		_, rest, _ := strings.Cut(string(stat), ") ")
		f := strings.Fields(rest)
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		cpu[int(pid)] = time.Duration(utime+stime) * clockTick
	}
	return cpu
}

// walPosition returns the server's current WAL position.
func walPosition(b *testing.B, pool *pgxpool.Pool) string {
	var lsn string
	require.NoError(b, pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&lsn))
	return lsn
}

// walSince returns the WAL bytes the server wrote since lsn (all its
// databases: the benchmark should run alone).
func walSince(b *testing.B, pool *pgxpool.Pool, lsn string) float64 {
	var n float64
	require.NoError(b, pool.QueryRow(context.Background(), `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)`, lsn).Scan(&n))
	return n
}
