//go:build faults

package faults

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outboxrelay/testkit"
)

// world is one scenario's outbox database, exchange and counting consumer.
type world struct {
	t        *testing.T
	url      string
	pool     *pgxpool.Pool
	exchange string
	count    *counter
}

func newWorld(t *testing.T) *world {
	t.Helper()
	url, pool := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	w := &world{t: t, url: url, pool: pool, exchange: exchange, count: newCounter(t, testkit.NewQueue(t, exchange, "#"))}
	return w
}

// relay starts an outboxrelay process on the world with extra arguments.
func (w *world) relay(args ...string) *testkit.Process {
	w.t.Helper()
	return w.relayVia(testkit.AMQPURL(), args...)
}

// relayVia starts a relay that reaches RabbitMQ at amqpURL (a proxy).
func (w *world) relayVia(amqpURL string, args ...string) *testkit.Process {
	w.t.Helper()
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"DATABASE_URL=" + w.url,
		"AMQP_URL=" + amqpURL,
		"OUTBOX_EXCHANGE=" + w.exchange,
		"OUTBOX_LOG_FORMAT=json",
	}
	return testkit.StartProcess(w.t, binary, env, append([]string{"run", "--no-migrate"}, args...)...)
}

// settle waits until every event of tag is delivered and marked, and adds
// the run to o; fault is when the run's fault began.
func (w *world) settle(o *outcome, tag string, n int, fault time.Time) {
	w.t.Helper()
	w.count.waitDistinct(w.t, tag, n, 3*time.Minute)
	testkit.WaitFor(w.t, 2*time.Minute, tag+": every event marked published", func() bool { return w.published(tag) == n })
	distinct, dups, last := w.count.stats(tag)
	w.t.Logf("%s: %d committed, %d delivered, %d duplicates, last delivery %s after the fault",
		tag, n, distinct, dups, last.Sub(fault).Round(time.Millisecond))
	o.Runs++
	o.Committed += n
	o.Delivered += distinct
	o.Lost += n - distinct
	o.Duplicated += dups
	o.Recovery = append(o.Recovery, last.Sub(fault))
}

// insert commits n events of type tag in one statement.
func (w *world) insert(tag string, n int) {
	w.t.Helper()
	testkit.Exec(w.t, w.pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', (i % 97)::text, $1, jsonb_build_object('n', i)
		FROM generate_series(1, $2) AS i`, tag, n)
}

// stream commits total events of type tag in transactions of 50, one every
// 10 ms (5,000 events/s), in the background, so that faults strike while
// events flow rather than after the relay has published a backlog. wait
// returns once all are committed. Inserts that fail while the database
// restarts are retried: an event counts once committed.
func (w *world) stream(tag string, total int) (wait func()) {
	w.t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for sent := 0; sent < total; {
			<-tick.C
			n := min(50, total-sent)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := w.pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
				SELECT 'order', (i % 97)::text, $1, jsonb_build_object('n', i)
				FROM generate_series($2::int, $3::int) AS i`, tag, sent+1, sent+n)
			cancel()
			if err == nil {
				sent += n
			}
		}
	}()
	return func() {
		select {
		case <-done:
		case <-time.After(5 * time.Minute):
			w.t.Fatalf("%s: the producer did not finish", tag)
		}
	}
}

// published is how many events of type tag are marked published, or -1
// while the database cannot be asked (it may be restarting).
func (w *world) published(tag string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	if err := w.pool.QueryRow(ctx, `SELECT count(*) FROM outbox WHERE event_type = $1 AND status = 'published'`, tag).Scan(&n); err != nil {
		return -1
	}
	return n
}

// counter counts deliveries by event type and message id, and when each
// type last saw a new id.
type counter struct {
	mu     sync.Mutex
	seen   map[string]map[string]int
	last   map[string]time.Time
	change chan struct{}
}

func newCounter(t *testing.T, q *testkit.Queue) *counter {
	c := &counter{seen: map[string]map[string]int{}, last: map[string]time.Time{}, change: make(chan struct{}, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case d, ok := <-q.Deliveries:
				if !ok {
					return
				}
				c.mu.Lock()
				ids := c.seen[d.Type]
				if ids == nil {
					ids = map[string]int{}
					c.seen[d.Type] = ids
				}
				if ids[d.MessageId] == 0 {
					c.last[d.Type] = time.Now()
				}
				ids[d.MessageId]++
				c.mu.Unlock()
				select {
				case c.change <- struct{}{}:
				default:
				}
			}
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return c
}

// stats returns the distinct events of type tag delivered, the duplicate
// deliveries, and when the last new one arrived.
func (c *counter) stats(tag string) (distinct, duplicates int, last time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.seen[tag] {
		distinct++
		duplicates += n - 1
	}
	return distinct, duplicates, c.last[tag]
}

// waitDistinct waits until at least n distinct events of type tag arrived.
func (c *counter) waitDistinct(t *testing.T, tag string, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		if d, _, _ := c.stats(tag); d >= n {
			return
		}
		select {
		case <-c.change:
		case <-deadline.C:
			d, _, _ := c.stats(tag)
			t.Fatalf("%s: %d of %d events delivered within %s", tag, d, n, timeout)
		}
	}
}
