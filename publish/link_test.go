package publish

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// Tests of a link to the broker that fails: cut, silent, slow or blocked.

// proxied dials a publisher through a fault-injecting proxy.
func proxied(t *testing.T, cfg Config) (*Publisher, *testkit.Proxy) {
	t.Helper()
	proxy, url := testkit.NewAMQPProxy(t)
	cfg.URL = url
	cfg.ReconnectMin = 20 * time.Millisecond
	cfg.ReconnectMax = 200 * time.Millisecond
	return dial(t, cfg), proxy
}

// warm runs p, binds a queue to its exchange and publishes a batch through
// it, which leaves a confirm channel in the pool: a test can then hold or
// black-hole the link without a channel having to be opened through it.
func warm(t *testing.T, p *Publisher) *testkit.Queue {
	t.Helper()
	run(t, p)
	q := testkit.NewQueue(t, p.cfg.Exchange, "#")
	msgs := batch(10, "k")
	requireAllNil(t, publish(t, p, msgs))
	receive(t, q, msgs)
	return q
}

// publishSent publishes msgs in the background and returns once the batch
// is sent (sent is signalled by p.afterSend); its result comes on the
// channel returned.
func publishSent(t *testing.T, p *Publisher, msgs []Message, sent <-chan struct{}) <-chan []error {
	t.Helper()
	result := make(chan []error, 1)
	go func() { result <- p.Publish(context.Background(), msgs) }()
	select {
	case <-sent:
	case <-time.After(10 * time.Second):
		t.Fatal("batch not sent")
	}
	return result
}

// publishAfterReconnect publishes small batches until one gets through
// on the publisher's new connection (a fresh connection on a busy machine
// may miss a short confirm deadline).
func publishAfterReconnect(t *testing.T, p *Publisher) {
	t.Helper()
	testkit.WaitFor(t, 15*time.Second, "publish after reconnect", func() bool {
		waitReady(t, p)
		for _, err := range p.Publish(context.Background(), batch(2, "k")) {
			if err != nil {
				return false
			}
		}
		return true
	})
}

func (p *Publisher) connected() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conn != nil
}

func waitReady(t *testing.T, p *Publisher) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	require.NoError(t, p.WaitReady(ctx))
}

func TestConnectionCutMidBatch(t *testing.T) {
	t.Parallel()
	p, proxy := proxied(t, Config{})
	sentC := make(chan struct{}, 1)
	p.afterSend = func() {
		select {
		case sentC <- struct{}{}:
		default:
		}
	}
	q := warm(t, p)

	// Hold everything in the proxy so nothing is confirmed, send a batch,
	// and cut the connection while its confirmations are awaited.
	proxy.Blackhole()
	msgs := batch(200, "k")
	result := publishSent(t, p, msgs, sentC)
	begin := time.Now()
	proxy.Cut()
	var errs []error
	select {
	case errs = <-result:
	case <-time.After(10 * time.Second):
		t.Fatal("Publish did not return after the cut")
	}
	require.Less(t, time.Since(begin), 5*time.Second, "failed by the cut, not by the confirm timeout")
	t.Logf("after the cut: %v", errs[0])
	for i, err := range errs {
		require.Error(t, err, "message %d", i)
		require.NotErrorIs(t, err, ErrNacked, "a lost connection is not a nack")
		require.NotErrorIs(t, err, ErrReturned)
		require.NotErrorIs(t, err, context.DeadlineExceeded)
	}

	// While it is down, Publish fails fast.
	testkit.WaitFor(t, 10*time.Second, "disconnect noticed", func() bool { return !p.connected() })
	errs = publish(t, p, batch(3, "k"))
	for _, err := range errs {
		require.ErrorIs(t, err, ErrNotConnected)
	}

	proxy.Heal()
	proxy.Restore()
	waitReady(t, p)
	next := batch(50, "k")
	requireAllNil(t, publish(t, p, next))
	receive(t, q, next)
}

func TestConfirmTimeout(t *testing.T) {
	t.Parallel()
	p, proxy := proxied(t, Config{ConfirmTimeout: 300 * time.Millisecond})
	warm(t, p)

	proxy.Blackhole()
	begin := time.Now()
	errs := publish(t, p, batch(10, "k"))
	require.Less(t, time.Since(begin), 5*time.Second)
	for i, err := range errs {
		require.ErrorIs(t, err, context.DeadlineExceeded, "message %d", i)
		require.ErrorContains(t, err, "confirm timeout 300ms")
	}
	// The channel was discarded, not pooled.
	p.mu.Lock()
	idle := len(p.idle)
	p.mu.Unlock()
	require.Zero(t, idle)

	// Without a pooled channel, opening one is bounded by the deadline too.
	begin = time.Now()
	errs = publish(t, p, batch(1, "k"))
	require.Less(t, time.Since(begin), 5*time.Second)
	require.ErrorIs(t, errs[0], context.DeadlineExceeded)
	require.ErrorContains(t, errs[0], "open channel")

	// The stalled connection is replaced.
	proxy.Cut()
	proxy.Heal()
	proxy.Restore()
	publishAfterReconnect(t, p)
}

// A broker that confirms slowly but steadily is waited for. Through a link
// that passes 40 KB a second, a batch of 100 messages of 1 KB reaches
// RabbitMQ in about 2.5 s, five times the 500 ms ConfirmTimeout, and is
// confirmed as it arrives: every message is confirmed, where a deadline
// on the whole batch would have failed most of it and had it published
// again. A link that then stops passing anything still fails a batch,
// ConfirmTimeout after its last progress.
func TestConfirmTimeoutIsRenewedByProgress(t *testing.T) {
	t.Parallel()
	p, proxy := proxied(t, Config{ConfirmTimeout: 500 * time.Millisecond})
	q := warm(t, p)

	proxy.Bandwidth(40)
	msgs := batch(100, "k")
	for i := range msgs {
		msgs[i].Body = fmt.Appendf(nil, `{"n":%d,"pad":%q}`, i, strings.Repeat("x", 1000))
	}
	begin := time.Now()
	requireAllNil(t, publish(t, p, msgs))
	require.Greater(t, time.Since(begin), time.Second, "the link passed the batch faster than it was meant to: the test proves nothing")
	receive(t, q, msgs)

	proxy.Blackhole()
	errs := publish(t, p, batch(10, "k"))
	for i, err := range errs {
		require.ErrorIs(t, err, context.DeadlineExceeded, "message %d", i)
	}
	proxy.Heal()
}

func TestWaitReadyWhileCut(t *testing.T) {
	t.Parallel()
	p, proxy := proxied(t, Config{})
	run(t, p)
	waitReady(t, p)
	testkit.NewQueue(t, p.cfg.Exchange, "#")

	proxy.Cut()
	testkit.WaitFor(t, 10*time.Second, "disconnect noticed", func() bool { return !p.connected() })

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, p.WaitReady(ctx), context.DeadlineExceeded)

	ready := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		ready <- p.WaitReady(ctx)
	}()
	select {
	case err := <-ready:
		t.Fatalf("WaitReady returned while cut: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	proxy.Restore()
	require.NoError(t, <-ready)
	require.True(t, p.connected())
	requireAllNil(t, publish(t, p, batch(1, "k")))
}

func TestWaitReadyWhileBlocked(t *testing.T) {
	t.Parallel()
	p := start(t, Config{})
	waitReady(t, p)

	// What Run does on connection.blocked / connection.unblocked.
	p.setBlocked(amqp.Blocking{Active: true, Reason: "low on memory"})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, p.WaitReady(ctx), context.DeadlineExceeded)
	errs := publish(t, p, batch(1, "k"))
	require.ErrorIs(t, errs[0], ErrNotConnected)
	require.ErrorContains(t, errs[0], "low on memory")

	ready := make(chan error, 1)
	go func() { ready <- p.WaitReady(context.Background()) }()
	p.setBlocked(amqp.Blocking{Active: false})
	select {
	case err := <-ready:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("WaitReady still blocked after unblock")
	}
}

// A batch in flight when the broker blocks the connection waits for the
// alarm to clear instead of failing at ConfirmTimeout: its messages may
// already be in the broker's hands, and failing them would only publish
// them twice. The proxy holds everything sent meanwhile, as a broker that
// stopped reading its socket does (proxy.Hold).
func TestBlockedConnectionHoldsItsBatch(t *testing.T) {
	t.Parallel()
	clock := testkit.NewClock()
	p, proxy := proxied(t, Config{ConfirmTimeout: 200 * time.Millisecond, Clock: clock})
	sent := make(chan struct{}, 1)
	var block atomic.Bool
	p.afterSend = func() {
		if block.Load() {
			// What Run does on connection.blocked.
			p.setBlocked(amqp.Blocking{Active: true, Reason: "low on memory"})
		}
		sent <- struct{}{}
	}
	q := warm(t, p)
	<-sent

	block.Store(true)
	proxy.Hold()
	msgs := batch(100, "k")
	result := publishSent(t, p, msgs, sent)
	// The batch's deadline stops while the connection is blocked: ten
	// confirm timeouts pass and no timer fires, so nothing may fail.
	testkit.WaitFor(t, 10*time.Second, "the batch's deadline to stop", func() bool { return len(clock.Pending()) == 0 })
	require.Zero(t, clock.Advance(10*p.cfg.ConfirmTimeout), "a deadline ran while the connection was blocked")
	select {
	case errs := <-result:
		t.Fatalf("Publish returned while the connection was blocked: %v", errs[0])
	default:
	}
	require.True(t, p.connected(), "the blocked connection was torn down")

	// The broker reads what it held, and confirms it: the batch succeeds
	// (whether the unblock notice comes before or after the confirms).
	proxy.Heal()
	select {
	case errs := <-result:
		requireAllNil(t, errs)
	case <-time.After(10 * time.Second):
		t.Fatal("Publish did not return once the broker read the batch")
	}
	p.setBlocked(amqp.Blocking{Active: false})
	receive(t, q, msgs)
}

// A publish that waits for the socket of a blocked connection cannot be
// interrupted by amqp091; when its caller gives up (a shutdown), the
// connection is closed under it, so Publish returns and Run reconnects.
func TestPublishStalledOnBlockedConnectionEndsWithItsContext(t *testing.T) {
	t.Parallel()
	// A deadline long enough to see the publish stall before it passes.
	p, proxy := proxied(t, Config{ConfirmTimeout: 2 * time.Second})
	warm(t, p)
	p.mu.Lock()
	wire := p.wire
	p.mu.Unlock()

	proxy.Hold()
	// Far more than the socket buffers and the proxy take in: writes stall.
	msgs := batch(64, "k")
	for i := range msgs {
		msgs[i].Body = []byte(`"` + strings.Repeat("x", 1<<20) + `"`)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	result := make(chan []error, 1)
	go func() { result <- p.Publish(ctx, msgs) }()
	testkit.WaitFor(t, 10*time.Second, "a publish waiting for the socket", func() bool {
		wire.mu.Lock()
		defer wire.mu.Unlock()
		return wire.stalled > 0
	})
	p.setBlocked(amqp.Blocking{Active: true, Reason: "low on memory"})
	// Blocked, the stalled write outlives its deadline.
	select {
	case errs := <-result:
		t.Fatalf("Publish returned while blocked: %v", errs[0])
	case <-time.After(2 * p.cfg.ConfirmTimeout):
	}

	cancel()
	select {
	case errs := <-result:
		for i, err := range errs {
			require.Error(t, err, "message %d", i)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Publish did not return after its context ended")
	}
	proxy.Heal()
	testkit.WaitFor(t, 15*time.Second, "a new connection", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.conn != nil && p.wire != wire
	})
	publishAfterReconnect(t, p)
}
