package inbox_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/inbox"
)

// The tests run against the real PostgreSQL and RabbitMQ: one database for
// the package (TestMain), and for each test tables of its own, a queue, a
// dead-letter exchange and a dead-letter queue of its own, deleted when the
// test ends.

const (
	defaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	defaultAMQPURL     = "amqp://guest:guest@127.0.0.1:5672/"
)

// postgresURL is TEST_DATABASE_URL (as in the relay's tests), or
// defaultPostgresURL: the admin database the tests create theirs from.
func postgresURL() string { return cmp.Or(os.Getenv("TEST_DATABASE_URL"), defaultPostgresURL) }

// amqpURL is TEST_AMQP_URL (as in the relay's tests), or defaultAMQPURL.
func amqpURL() string { return cmp.Or(os.Getenv("TEST_AMQP_URL"), defaultAMQPURL) }

// sharedDatabaseURL is the database TestMain created for the package.
var sharedDatabaseURL string

// uniqueName is prefix followed by an underscore and 12 random hex digits.
func uniqueName(prefix string) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return prefix + "_" + hex.EncodeToString(b[:])
}

// createDatabase creates an empty database and returns its URL and a
// function that drops it (WITH FORCE: connections left open do not keep it).
func createDatabase(ctx context.Context) (string, func() error, error) {
	admin := postgresURL()
	u, err := url.Parse(admin)
	if err != nil {
		return "", nil, fmt.Errorf("parse TEST_DATABASE_URL: %w", err)
	}
	name := uniqueName("inbox_test")
	if err := adminExec(ctx, admin, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", nil, fmt.Errorf("create database %s: %w", name, err)
	}
	drop := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := adminExec(ctx, admin, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("drop database %s: %w", name, err)
		}
		return nil
	}
	u.Path = "/" + name
	return u.String(), drop, nil
}

// adminExec runs one statement on a connection of its own.
func adminExec(ctx context.Context, databaseURL, sql string) error {
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// newPool opens a pool of up to 40 connections (more than a consumer's
// prefetch) on databaseURL, then changed by configure, closed when the
// test ends.
func newPool(t testing.TB, databaseURL string, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(databaseURL)
	require.NoError(t, err)
	cfg.MaxConns = 40
	for _, f := range configure {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// env is one test's world: an inbox table and an effects table (where the
// test handlers write), a queue whose dead-letter exchange routes to a
// dead-letter queue, a channel to publish and inspect with, and a registry.
type env struct {
	t       *testing.T
	pool    *pgxpool.Pool
	table   string // the inbox table
	effects string // the handlers' business table: (message_id, note)
	queue   string
	dlx     string
	dlq     string
	ch      *amqp.Channel
	reg     *prometheus.Registry
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	e := &env{
		t:       t,
		pool:    newPool(t, sharedDatabaseURL),
		table:   uniqueName("inbox"),
		queue:   uniqueName("inbox-test"),
		reg:     prometheus.NewRegistry(),
		effects: uniqueName("effects"),
	}
	e.dlx, e.dlq = e.queue+"-dlx", e.queue+"-dlq"
	require.NoError(t, inbox.Migrate(ctx, e.pool, e.table))
	e.exec(`CREATE TABLE ` + pgx.Identifier{e.effects}.Sanitize() + ` (message_id text NOT NULL, note text)`)
	t.Cleanup(func() {
		_, err := e.pool.Exec(context.Background(), `DROP TABLE `+pgx.Identifier{e.table}.Sanitize()+`, `+pgx.Identifier{e.effects}.Sanitize())
		require.NoError(t, err)
	})

	conn, err := amqp.Dial(amqpURL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	e.ch, err = conn.Channel()
	require.NoError(t, err)
	require.NoError(t, e.ch.Confirm(false))
	require.NoError(t, e.ch.ExchangeDeclare(e.dlx, "fanout", false, false, false, false, nil))
	_, err = e.ch.QueueDeclare(e.dlq, false, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, e.ch.QueueBind(e.dlq, "", e.dlx, false, nil))
	_, err = e.ch.QueueDeclare(e.queue, true, false, false, false, amqp.Table{"x-dead-letter-exchange": e.dlx})
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := e.ch.QueueDelete(e.queue, false, false, false)
		require.NoError(t, err)
		_, err = e.ch.QueueDelete(e.dlq, false, false, false)
		require.NoError(t, err)
		require.NoError(t, e.ch.ExchangeDelete(e.dlx, false, false))
	})
	return e
}

// config is a consumer of e's queue and table, retrying quickly, logging
// to the test's log.
func (e *env) config(name string, h inbox.Handler) inbox.Config {
	return inbox.Config{
		AMQPURL:    amqpURL(),
		Queue:      e.queue,
		Name:       name,
		DB:         e.pool,
		Handler:    h,
		Table:      e.table,
		RetryMin:   time.Millisecond,
		RetryMax:   20 * time.Millisecond,
		Registerer: e.reg,
		Logger:     testLogger(e.t),
	}
}

// start runs a Consumer of cfg until the returned stop is called (or the
// test ends); stop cancels Run's context and returns Run's error, failing
// the test if Run takes more than a minute to return.
func (e *env) start(cfg inbox.Config) (stop func() error) {
	e.t.Helper()
	c, err := inbox.New(cfg)
	require.NoError(e.t, err)
	return startConsumer(e.t, c)
}

func startConsumer(t testing.TB, c *inbox.Consumer) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case runErr = <-done:
			case <-time.After(time.Minute):
				runErr = errors.New("Run did not return within a minute of its cancel")
			}
		})
		return runErr
	}
	t.Cleanup(func() { require.NoError(t, stop()) })
	return stop
}

// publish publishes a persistent message to e's queue and waits for the
// broker's confirm. id "" publishes no message-id.
func (e *env) publish(id, body string, headers amqp.Table) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dc, err := e.ch.PublishWithDeferredConfirmWithContext(ctx, "", e.queue, true, false, amqp.Publishing{
		MessageId: id, Body: []byte(body), Headers: headers, DeliveryMode: amqp.Persistent,
	})
	require.NoError(e.t, err)
	ok, err := dc.WaitContext(ctx)
	require.NoError(e.t, err)
	require.True(e.t, ok, "the broker nacked the publish")
}

// getFrom waits up to timeout for a message in queue and takes it (acked).
func (e *env) getFrom(queue string, timeout time.Duration) amqp.Delivery {
	e.t.Helper()
	var d amqp.Delivery
	eventually(e.t, timeout, func() bool {
		var ok bool
		var err error
		d, ok, err = e.ch.Get(queue, true)
		require.NoError(e.t, err)
		return ok
	}, "no message in %s", queue)
	return d
}

// ready returns how many messages are ready in queue (not those delivered
// and unacked).
func (e *env) ready(queue string) int {
	e.t.Helper()
	q, err := e.ch.QueueDeclarePassive(queue, false, false, false, false, nil)
	require.NoError(e.t, err)
	return q.Messages
}

// exec runs sql on e's pool.
func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	_, err := e.pool.Exec(context.Background(), sql, args...)
	require.NoError(e.t, err)
}

// count returns the one integer sql selects.
func (e *env) count(sql string, args ...any) int {
	e.t.Helper()
	var n int
	require.NoError(e.t, e.pool.QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}

// effectsOf returns how many effects rows message id has.
func (e *env) effectsOf(id string) int {
	return e.count(`SELECT count(*) FROM `+pgx.Identifier{e.effects}.Sanitize()+` WHERE message_id = $1`, id)
}

// record is an inbox row.
type record struct {
	Processed bool
	Attempts  int
	LastError *string
}

// record returns the inbox row of (name, id), and whether there is one.
func (e *env) record(name, id string) (record, bool) {
	e.t.Helper()
	var r record
	err := e.pool.QueryRow(context.Background(),
		`SELECT processed_at IS NOT NULL, attempts, last_error FROM `+pgx.Identifier{e.table}.Sanitize()+` WHERE consumer = $1 AND message_id = $2`,
		name, id).Scan(&r.Processed, &r.Attempts, &r.LastError)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false
	}
	require.NoError(e.t, err)
	return r, true
}

// metric returns the value of the counter name with labels in e's
// registry, 0 when it has none.
func (e *env) metric(name string, labels map[string]string) float64 {
	e.t.Helper()
	families, err := e.reg.Gather()
	require.NoError(e.t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount())
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// insertEffect is the test handlers' business write.
func (e *env) insertEffect(ctx context.Context, tx pgx.Tx, id, note string) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{e.effects}.Sanitize()+` (message_id, note) VALUES ($1, $2)`, id, note)
	return err
}

// eventually polls cond every 10ms until it holds, failing the test after
// timeout.
func eventually(t testing.TB, timeout time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: "+msg, append([]any{timeout}, args...)...)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// testLogger logs to t's log.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
