package relay_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/relay"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/notify"
	"github.com/outboxrelay/outboxrelay/publish"
)

// The harness of the tests against the real services: each test gets an
// outbox database, an exchange and a queue of its own, and starts relays on
// them through env.start.

// env is one test's outbox database, exchange and consumer queue.
type env struct {
	url      string
	pool     *pgxpool.Pool
	exchange string
	queue    *testkit.Queue
}

func newEnv(t *testing.T) *env {
	t.Helper()
	url, pool := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	return &env{url: url, pool: pool, exchange: exchange, queue: testkit.NewQueue(t, exchange, "#")}
}

// options adjust one relay of a test.
type options struct {
	relay    relay.Config
	claim    claim.Config
	publish  publish.Config
	notify   notify.Config
	noListen bool
	noGate   bool // producers always notify, as with a schema from before the gate
	floor    bool // claims start above the store's floor, as the binary's do
	// gateTTL is the gate's TTL (notify.NewGate's ttl); 0 means its
	// default, 2s.
	gateTTL time.Duration
}

// running is a relay started by start; stop shuts it down and returns Run's
// result.
type running struct {
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.once.Do(func() {
		r.cancel()
		select {
		case r.err = <-r.done:
		case <-time.After(60 * time.Second):
			t.Fatal("relay did not stop within 60s")
		}
	})
	return r.err
}

func (e *env) start(t *testing.T, o options) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	// The relay has a pool of its own, as in production, apart from the
	// test's producers.
	poolConfig, err := pgxpool.ParseConfig(e.url)
	require.NoError(t, err)
	poolConfig.ConnConfig.RuntimeParams["application_name"] = "outboxrelay"
	o.claim.ConfigurePool(poolConfig)
	relayPool, err := pgxpool.NewWithConfig(ctx, poolConfig)
	require.NoError(t, err)
	t.Cleanup(relayPool.Close)
	store, err := claim.New(relayPool, o.claim)
	require.NoError(t, err)
	o.publish.URL = cmpOr(o.publish.URL, testkit.AMQPURL())
	o.publish.Exchange = e.exchange
	o.publish.SkipDeclare = true
	pub, err := publish.Dial(ctx, o.publish)
	require.NoError(t, err)
	var listener relay.Listener
	if !o.noListen {
		cc, err := pgx.ParseConfig(e.url)
		require.NoError(t, err)
		o.notify.ConnConfig = cc
		o.notify.Pinger = relayPool
		l, err := notify.New(o.notify)
		require.NoError(t, err)
		listener = l
	}
	if !o.noGate {
		gate, err := notify.NewGate(relayPool, "outbox", pgx.Identifier{"outbox"}, pgx.Identifier{"outbox_wakeup"}, o.gateTTL)
		require.NoError(t, err)
		o.relay.Gate = gate
	}
	if o.floor {
		o.relay.Floor = store
	}
	if o.relay.Logger == nil {
		o.relay.Logger = testLogger(t)
	}
	r, err := relay.New(o.relay, store, pub, listener)
	require.NoError(t, err)
	run := &running{cancel: cancel, done: make(chan error, 1)}
	go func() {
		err := r.Run(ctx)
		pub.Close()
		run.done <- err
	}()
	t.Cleanup(func() { require.NoError(t, run.stop(t)) })
	return run
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

func (e *env) count(t *testing.T, where string) int64 {
	t.Helper()
	return testkit.QueryInt(t, e.pool, "SELECT count(*) FROM outbox WHERE "+where)
}

// collect receives until want distinct message ids have arrived.
func (e *env) collect(t *testing.T, counter testkit.Counter, want int, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for len(counter) < want {
		select {
		case d := <-e.queue.Deliveries:
			counter[d.MessageId]++
		case <-deadline.C:
			t.Fatalf("%d of %d events arrived within %s", len(counter), want, timeout)
		}
	}
}

// streamThrough writes n events from four producers, calls fault each time
// the consumer has seen the next number of distinct events in at, and
// returns the counter once every event has arrived and is marked published.
func (e *env) streamThrough(t *testing.T, n int, at []int, fault func()) testkit.Counter {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		insert(t, e.pool, n, 4)
	}()
	counter := testkit.Counter{}
	for _, k := range at {
		e.collect(t, counter, k, 60*time.Second)
		fault()
	}
	<-done
	e.collect(t, counter, n, 120*time.Second)
	testkit.WaitFor(t, 60*time.Second, "all rows published", func() bool {
		return e.count(t, "status = 'published'") == int64(n)
	})
	return counter
}

// insert writes n events: in one transaction when producers is 1, otherwise
// from that many concurrent producers, each event its own transaction.
func insert(t *testing.T, pool *pgxpool.Pool, n, producers int) {
	t.Helper()
	if producers == 1 {
		testkit.InsertEvents(t, pool, n)
		return
	}
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			for i := p; i < n; i += producers {
				_, err := pool.Exec(context.Background(),
					`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'created', $2)`,
					fmt.Sprint(i%97), fmt.Sprintf(`{"n": %d}`, i))
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
