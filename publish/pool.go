package publish

import (
	"context"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// maxIdleChannels is how many confirm channels the pool keeps between
// batches; more may be open while more batches are in flight.
const maxIdleChannels = 16

// borrow takes a pooled channel of the current connection, or opens one,
// waiting at most until ctx ends (an abandoned opening closes its channel
// when it completes).
func (p *Publisher) borrow(ctx context.Context, conn *amqp.Connection, gen uint64) (*channel, error) {
	p.mu.Lock()
	for len(p.idle) > 0 {
		c := p.idle[len(p.idle)-1]
		p.idle[len(p.idle)-1] = nil
		p.idle = p.idle[:len(p.idle)-1]
		if c.usable(gen) {
			p.mu.Unlock()
			return c, nil
		}
		// Closed, or of an older connection: nothing left to close.
	}
	p.mu.Unlock()

	type opened struct {
		c   *channel
		err error
	}
	res := make(chan opened)
	open := func() {
		c, err := openChannel(conn, gen, p.start)
		select {
		case res <- opened{c, err}:
		case <-ctx.Done():
			if c != nil {
				_ = c.ch.Close()
			}
		}
	}
	if !p.start(open) {
		return nil, ErrClosed
	}
	select {
	case r := <-res:
		return r.c, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("publish: open channel: %w", context.Cause(ctx))
	}
}

// release returns a channel to the pool, or closes it (in the background:
// closing is a round trip to the broker) when it cannot be trusted with
// another batch or the pool is full.
func (p *Publisher) release(c *channel, reusable bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if reusable && !p.closed && p.conn != nil && len(p.idle) < maxIdleChannels && c.usable(p.gen) {
		p.idle = append(p.idle, c)
		return
	}
	if p.closed || c.ch.IsClosed() {
		return // closing the connection closes it
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		_ = c.ch.Close()
	}()
}
