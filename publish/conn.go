package publish

import (
	"context"
	"net"
	"time"
)

// writeDeadlineConn bounds every write: amqp091 writes are not
// context-aware, so a socket the broker stopped reading (a resource alarm,
// a silent network partition) would otherwise block a publishing
// goroutine, and every other one behind the connection's write lock,
// forever. A write that times out makes amqp091 shut the connection down,
// and Run reconnects.
type writeDeadlineConn struct {
	net.Conn
	timeout time.Duration
}

func (c *writeDeadlineConn) Write(b []byte) (int, error) {
	if err := c.Conn.SetWriteDeadline(time.Now().Add(c.timeout)); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

// dialer returns an amqp.Config.Dial function: TCP under DialTimeout and
// ctx, a deadline over the TLS and AMQP handshakes (amqp091 clears it once
// the connection is open), and bounded writes.
func (p *Publisher) dialer(ctx context.Context) func(network, addr string) (net.Conn, error) {
	return func(network, addr string) (net.Conn, error) {
		d := net.Dialer{Timeout: p.cfg.DialTimeout}
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if err := conn.SetDeadline(time.Now().Add(p.cfg.DialTimeout)); err != nil {
			conn.Close()
			return nil, err
		}
		return &writeDeadlineConn{Conn: conn, timeout: p.cfg.ConfirmTimeout}, nil
	}
}
