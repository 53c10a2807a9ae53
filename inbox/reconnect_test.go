package inbox_test

import (
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
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

// proxy forwards TCP connections to an upstream address, and cuts them all
// on demand.
type proxy struct {
	ln       net.Listener
	upstream string
	mu       sync.Mutex
	conns    []net.Conn
	n        int
	wg       sync.WaitGroup
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
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(up, down)
		go p.pipe(down, up)
	}
}

func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
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
