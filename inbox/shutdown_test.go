package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/inbox"
)

// An idle consumer's Run returns soon after its context is cancelled.
func TestRunReturnsOnCancel(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c, err := inbox.New(e.config("svc", func(context.Context, pgx.Tx, amqp.Delivery) error { return nil }))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	e.publish("m1", "", nil)
	eventually(t, wait, func() bool { return e.metric("inbox_processed_total", nil) == 1 }, "not processed")
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within 5s of its cancel")
	}
}

// On cancel, a handler in flight finishes, commits and is acked; one still
// running at ShutdownTimeout has its context cancelled, its transaction
// rolled back, and its delivery is not acked: the broker redelivers it.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	started := make(chan string, 2)
	release := make(chan struct{})
	slowCancelled := make(chan error, 1)
	cfg := e.config("svc", func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		if err := e.insertEffect(ctx, tx, d.MessageId, ""); err != nil {
			return err
		}
		started <- d.MessageId
		if d.MessageId == "fast" {
			<-release
			return nil
		}
		<-ctx.Done() // "slow": runs past the ShutdownTimeout
		slowCancelled <- ctx.Err()
		return ctx.Err()
	})
	cfg.ShutdownTimeout = 500 * time.Millisecond
	c, err := inbox.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	e.publish("fast", "", nil)
	e.publish("slow", "", nil)
	for range 2 {
		select {
		case <-started:
		case <-time.After(wait):
			t.Fatal("the handlers did not start")
		}
	}
	begun := time.Now()
	cancel()
	close(release) // "fast" finishes after the shutdown began
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(wait):
		t.Fatal("Run did not return")
	}
	require.GreaterOrEqual(t, time.Since(begun), cfg.ShutdownTimeout, "Run returned before the slow handler's timeout")
	require.ErrorIs(t, <-slowCancelled, context.Canceled)

	require.Equal(t, 1, e.effectsOf("fast"))
	r, ok := e.record("svc", "fast")
	require.True(t, ok)
	require.True(t, r.Processed)
	require.Equal(t, 0, e.effectsOf("slow"), "the cancelled handler's transaction committed")
	r, ok = e.record("svc", "slow")
	require.False(t, ok && r.Processed)
	require.Zero(t, r.Attempts, "the shutdown counted as a failed attempt")

	d := e.getFrom(e.queue, wait)
	require.Equal(t, "slow", d.MessageId)
	require.True(t, d.Redelivered)
	require.Equal(t, 0, e.ready(e.queue), "the finished handler's delivery was not acked")
}
