package inbox_test

import (
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/outboxrelay/outboxrelay/inbox"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

// A connection cut between the commit and the ack: the ack is lost, the
// broker redelivers the message to the reconnected consumer, which finds it
// processed and acks it without running the handler again.
func TestCutBetweenCommitAndAck(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := newProxy(t, "127.0.0.1:5672")
	var got calls
	cfg := e.config("svc", func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		if got.add(d.MessageId) == 1 && d.MessageId == "m1" {
			p.cut() // the commit that follows succeeds; the ack cannot
		}
		return e.insertEffect(ctx, tx, d.MessageId, "")
	})
	cfg.AMQPURL = p.url(t, amqpURL())
	e.start(cfg)
	e.publish("m1", "", nil)
	eventually(t, wait, func() bool { return e.metric("inbox_duplicates_total", nil) == 1 }, "the redelivery was not found a duplicate")
	e.publish("m2", "", nil) // the consumer reconnected
	eventually(t, wait, func() bool { return e.metric("inbox_processed_total", nil) == 2 }, "m2 not processed")
	require.Equal(t, 1, got.of("m1"))
	require.Equal(t, 1, e.effectsOf("m1"))
	require.GreaterOrEqual(t, p.accepted(), 2)
	eventually(t, wait, func() bool { return e.ready(e.queue) == 0 }, "messages left in the queue")
}

// A connection cut in the middle of the first handshake looks to amqp091-go
// like a refused login (ErrCredentials). The consumer retries it and
// consumes, instead of giving up as on a login the broker refuses.
func TestHandshakeCutIsRetried(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := newProxy(t, "127.0.0.1:5672")
	p.closeHandshakes(handshakeRefusalsForTest - 1)
	cfg := e.config("svc", func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		return e.insertEffect(ctx, tx, d.MessageId, "")
	})
	cfg.AMQPURL = p.url(t, amqpURL())
	c, err := inbox.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	e.publish("m1", "", nil)
	eventually(t, wait, func() bool {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("Run returned after a cut handshake: %v", err)
		default:
		}
		return e.metric("inbox_processed_total", nil) == 1
	}, "m1 not processed")
	require.Equal(t, handshakeRefusalsForTest, p.accepted())
}

// A login the broker refuses is not retried for ever: Run returns the
// refusal.
func TestRunFailsOnWrongPassword(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := e.config("svc", func(context.Context, pgx.Tx, amqp.Delivery) error { return nil })
	u, err := url.Parse(amqpURL())
	require.NoError(t, err)
	u.User = url.UserPassword("guest", "not-the-password")
	cfg.AMQPURL = u.String()
	c, err := inbox.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = c.Run(ctx)
	require.ErrorIs(t, err, amqp.ErrCredentials)
	require.NoError(t, ctx.Err(), "Run retried the refused login until its context ended")
	require.NotContains(t, err.Error(), "not-the-password")
}

// handshakeRefusalsForTest is how many closed handshakes in a row the
// consumer takes for a refused login (handshakeRefusals in consumer.go).
const handshakeRefusalsForTest = 3

// proxy forwards TCP connections to an upstream address, and cuts them all
// on demand.
type proxy struct {
	ln       net.Listener
	upstream string
	mu       sync.Mutex
	conns    []net.Conn
	n        int
	toClose  int // handshakes still to close after the client's login
	wg       sync.WaitGroup
}

// closeHandshakes makes the next n connections close in the middle of the
// AMQP handshake: after the protocol header, when the client sends its
// login (connection.start-ok).
func (p *proxy) closeHandshakes(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.toClose = n
}

func newProxy(t *testing.T, upstream string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{ln: ln, upstream: upstream}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

// url is amqpURL with the proxy's address.
func (p *proxy) url(t *testing.T, amqpURL string) string {
	u, err := url.Parse(amqpURL)
	require.NoError(t, err)
	u.Host = p.ln.Addr().String()
	return u.String()
}

func (p *proxy) serve() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = down.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, down, up)
		p.n++
		closeHandshake := p.toClose > 0
		if closeHandshake {
			p.toClose--
		}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(down, up)
		if closeHandshake {
			go p.closeAtLogin(up, down)
		} else {
			go p.pipe(up, down)
		}
	}
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
}

// closeAtLogin passes the client's protocol header upstream, then closes
// both sides as soon as the client sends anything more (its login).
func (p *proxy) closeAtLogin(up, down net.Conn) {
	defer p.wg.Done()
	header := make([]byte, 8)
	if _, err := io.ReadFull(down, header); err == nil {
		if _, err := up.Write(header); err == nil {
			_, _ = down.Read(make([]byte, 1))
		}
	}
	_ = up.Close()
	_ = down.Close()
}

// cut closes every connection through the proxy.
func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// accepted returns how many connections the proxy accepted.
func (p *proxy) accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}
