package inbox_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

const wait = 20 * time.Second // how long a test waits for an event

// calls counts a handler's calls per message id.
type calls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *calls) add(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[id]++
	return c.n[id]
}

func (c *calls) of(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

func TestProcessesOnceAndSkipsDuplicates(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var got calls
	e.start(e.config("svc", func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		got.add(d.MessageId)
		return e.insertEffect(ctx, tx, d.MessageId, string(d.Body))
	}))

	e.publish("m1", "first", nil)
	eventually(t, wait, func() bool { return e.metric("inbox_processed_total", nil) == 1 }, "m1 not processed")
	e.publish("m1", "again", nil) // a duplicate, after the first was processed
	e.publish("m2", "second", nil)
	eventually(t, wait, func() bool {
		return e.metric("inbox_processed_total", nil) == 2 && e.metric("inbox_duplicates_total", nil) == 1
	}, "m2 not processed or the duplicate not counted")

	require.Equal(t, 1, got.of("m1"), "the duplicate ran the handler")
	require.Equal(t, 1, got.of("m2"))
	require.Equal(t, 1, e.effectsOf("m1"))
	r, ok := e.record("svc", "m1")
	require.True(t, ok)
	require.Equal(t, record{Processed: true}, r)
	require.Equal(t, float64(2), e.metric("inbox_handler_duration_seconds", map[string]string{"consumer": "svc"}))
	eventually(t, wait, func() bool { return e.ready(e.queue) == 0 }, "messages left in the queue")
}

// Two consumer names each process the message: the key is (consumer,
// message id).
func TestConsumerNamesAreIndependent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var got calls
	h := func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		got.add(d.MessageId)
		return nil
	}
	stop := e.start(e.config("billing", h))
	e.publish("m1", "", nil)
	eventually(t, wait, func() bool { return got.of("m1") == 1 }, "not processed")
	require.NoError(t, stop()) // each name has its queue; here they take turns on one
	e.start(e.config("shipping", h))
	e.publish("m1", "", nil)
	eventually(t, wait, func() bool { return got.of("m1") == 2 }, "another consumer name skipped the message")
}

// Two copies of one message delivered at the same time (to two consumers,
// or to one with prefetch) run the handler once: the first copy's insert
// holds the row's lock until its transaction ends, the second copy's insert
// waits for it, then finds the message processed. The first handler waits
// until PostgreSQL shows the second insert waiting for its lock, so the
// copies do overlap.
func TestConcurrentCopiesRunOnce(t *testing.T) {
	t.Parallel()
	for _, consumers := range []int{1, 2} {
		t.Run(map[int]string{1: "one consumer, prefetch", 2: "two consumers"}[consumers], func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			var got calls
			var waited atomic.Bool
			h := func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
				got.add(d.MessageId)
				deadline := time.Now().Add(wait)
				for time.Now().Before(deadline) {
					if e.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
						AND wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'`, e.table) > 0 {
						waited.Store(true)
						break
					}
					time.Sleep(5 * time.Millisecond)
				}
				return e.insertEffect(ctx, tx, d.MessageId, "")
			}
			// Both copies are in the queue before any consumer starts.
			e.publish("m1", "copy 1", nil)
			e.publish("m1", "copy 2", nil)
			for i := 0; i < consumers; i++ {
				cfg := e.config("svc", h)
				cfg.Prefetch = 2 / consumers // one copy each with two consumers
				e.start(cfg)
			}
			eventually(t, wait, func() bool {
				return e.metric("inbox_processed_total", nil) == 1 && e.metric("inbox_duplicates_total", nil) == 1
			}, "the copies were not processed and skipped")
			require.True(t, waited.Load(), "the second copy never waited for the first one's lock")
			require.Equal(t, 1, got.of("m1"), "the handler ran for both copies")
			require.Equal(t, 1, e.effectsOf("m1"))
			eventually(t, wait, func() bool { return e.ready(e.queue) == 0 }, "messages left in the queue")
		})
	}
}

// A handler that fails (an error, or a panic) has its transaction rolled
// back: its writes and the message's record go with it, the attempt is
// counted, and the message is processed again, once, by the retry.
func TestFailedHandlerRollsBackAndRetries(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		fail func() error
	}{
		{"error", func() error { return errors.New("boom") }},
		{"panic", func() error { panic("boom") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			var got calls
			e.start(e.config("svc", func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
				n := got.add(d.MessageId)
				if err := e.insertEffect(ctx, tx, d.MessageId, "attempt"); err != nil {
					return err
				}
				if n == 1 {
					return tc.fail()
				}
				return nil
			}))
			e.publish("m1", "", nil)
			eventually(t, wait, func() bool { return e.metric("inbox_processed_total", nil) == 1 }, "not processed")
			require.Equal(t, 2, got.of("m1"))
			require.Equal(t, 1, e.effectsOf("m1"), "the failed attempt's write was not rolled back")
			require.Equal(t, float64(1), e.metric("inbox_retried_total", nil))
			r, ok := e.record("svc", "m1")
			require.True(t, ok)
			require.True(t, r.Processed)
			require.Equal(t, 1, r.Attempts, "the failed attempt was not counted")
			require.NotNil(t, r.LastError)
			require.Contains(t, *r.LastError, "boom")
			eventually(t, wait, func() bool { return e.ready(e.queue) == 0 }, "message left in the queue")
		})
	}
}

// A message that fails MaxAttempts times is rejected to the dead-letter
// exchange, counted, and gets fresh attempts for when it is moved back.
func TestDeadLettersAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var got calls
	cfg := e.config("svc", func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		got.add(d.MessageId)
		return errors.New("always")
	})
	cfg.MaxAttempts = 3
	e.start(cfg)
	e.publish("m1", "poison", nil)
	d := e.getFrom(e.dlq, wait)
	require.Equal(t, "m1", d.MessageId)
	require.Equal(t, "poison", string(d.Body))
	require.Equal(t, 3, got.of("m1"))
	require.Equal(t, float64(1), e.metric("inbox_dead_lettered_total", map[string]string{"reason": "attempts"}))
	require.Equal(t, float64(2), e.metric("inbox_retried_total", nil))
	eventually(t, wait, func() bool {
		r, ok := e.record("svc", "m1")
		return ok && !r.Processed && r.Attempts == 0 && r.LastError != nil
	}, "the dead-lettered message's attempts were not reset")
}

// The attempts are counted in PostgreSQL: a new Consumer (a restart) goes
// on from the attempts of the one before.
func TestAttemptsSurviveRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var first, second calls
	cfg := e.config("svc", func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		first.add(d.MessageId)
		return errors.New("fails")
	})
	cfg.MaxAttempts = 2
	cfg.RetryMin, cfg.RetryMax = time.Hour, time.Hour // no retry before the stop
	stop := e.start(cfg)
	e.publish("m1", "", nil)
	eventually(t, wait, func() bool { r, _ := e.record("svc", "m1"); return r.Attempts == 1 }, "attempt 1 not counted")
	require.NoError(t, stop()) // the delivery goes back to the queue
	require.Equal(t, 1, first.of("m1"))

	cfg.Handler = func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		second.add(d.MessageId)
		return errors.New("fails")
	}
	cfg.RetryMin, cfg.RetryMax = time.Millisecond, time.Millisecond
	e.start(cfg)
	d := e.getFrom(e.dlq, wait)
	require.Equal(t, "m1", d.MessageId)
	require.Equal(t, 1, second.of("m1"), "the restarted consumer did not go on from attempt 1")
}

// A delivery without an id is rejected to the dead-letter exchange and
// counted; its handler never runs. With IDHeader, the header is the id.
func TestMissingIDIsDeadLettered(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		idHeader string
		with     func(e *env) // publishes a message with an id
		without  func(e *env) // publishes a message without one
	}{
		{"message-id", "",
			func(e *env) { e.publish("m1", "with", nil) },
			func(e *env) { e.publish("", "without", amqp.Table{"id": "h1"}) }},
		{"header", "id",
			func(e *env) { e.publish("", "with", amqp.Table{"id": "m1"}) },
			func(e *env) { e.publish("m2", "without", amqp.Table{"id": int32(7)}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			var bodies sync.Map
			cfg := e.config("svc", func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
				bodies.Store(string(d.Body), true)
				return nil
			})
			cfg.IDHeader = tc.idHeader
			e.start(cfg)
			tc.without(e)
			tc.with(e)
			d := e.getFrom(e.dlq, wait)
			require.Equal(t, "without", string(d.Body))
			eventually(t, wait, func() bool { return e.metric("inbox_processed_total", nil) == 1 }, "the message with an id was not processed")
			_, ran := bodies.Load("without")
			require.False(t, ran, "the handler ran for a message without an id")
			require.Equal(t, float64(1), e.metric("inbox_dead_lettered_total", map[string]string{"reason": "missing_id"}))
			_, ok := e.record("svc", "m1")
			require.True(t, ok)
		})
	}
}

// The ack comes after the commit, and only when it succeeded: a handler
// whose commit fails (a deferred constraint) does not have its delivery
// acked; with one attempt allowed, it is dead-lettered, and its write is not
// there. Acking before the commit would lose it instead.
func TestAckOnlyAfterCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	strict := uniqueName("strict")
	e.exec(`CREATE TABLE ` + pgx.Identifier{strict}.Sanitize() + ` (k text UNIQUE DEFERRABLE INITIALLY DEFERRED)`)
	t.Cleanup(func() { e.exec(`DROP TABLE ` + pgx.Identifier{strict}.Sanitize()) })
	var got calls
	cfg := e.config("svc", func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		got.add(d.MessageId)
		if err := e.insertEffect(ctx, tx, d.MessageId, ""); err != nil {
			return err
		}
		// Two equal keys: refused at COMMIT, not here.
		_, err := tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{strict}.Sanitize()+` VALUES ($1), ($1)`, d.MessageId)
		return err
	})
	cfg.MaxAttempts = 1
	e.start(cfg)
	e.publish("m1", "refused at commit", nil)
	d := e.getFrom(e.dlq, wait)
	require.Equal(t, "m1", d.MessageId)
	require.Equal(t, 1, got.of("m1"))
	require.Equal(t, 0, e.effectsOf("m1"))
	require.Equal(t, float64(0), e.metric("inbox_processed_total", nil))
	r, _ := e.record("svc", "m1")
	require.False(t, r.Processed)
	require.Contains(t, *r.LastError, "commit")
}

// A database connection lost under the handler (here its backend is
// terminated, as by pg_terminate_backend or a restart) is not the handler's
// failure: not counted as an attempt, nothing acked, the message retried
// and processed once.
func TestLostConnectionIsNotAnAttempt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var got calls
	cfg := e.config("svc", func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		if err := e.insertEffect(ctx, tx, d.MessageId, ""); err != nil {
			return err
		}
		if got.add(d.MessageId) == 1 {
			_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
			return err
		}
		return nil
	})
	cfg.MaxAttempts = 1 // a counted attempt would dead-letter it
	e.start(cfg)
	e.publish("m1", "", nil)
	eventually(t, wait, func() bool { return e.metric("inbox_processed_total", nil) == 1 }, "not processed")
	require.Equal(t, 2, got.of("m1"))
	require.Equal(t, 1, e.effectsOf("m1"))
	r, _ := e.record("svc", "m1")
	require.Equal(t, record{Processed: true}, r)
	require.Zero(t, e.metric("inbox_retried_total", nil))
	require.Equal(t, float64(1), e.metric("inbox_database_failures_total", nil))
	require.Zero(t, e.metric("inbox_dead_lettered_total", nil))
}
