package publish

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// maxPending bounds what coalescingConn holds unwritten; a Write beyond it
// waits for the socket.
const maxPending = 1 << 20

// coalescingConn is the broker connection under amqp091. It does two things
// amqp091 does not:
//
//   - It coalesces writes. amqp091 flushes every publish to the socket, one
//     system call and one TCP segment per message. Here Write only appends
//     to a buffer, and one goroutine writes whatever has accumulated: a
//     lone publish goes out at once, a batch goes out in a few large writes,
//     which costs both the relay and RabbitMQ far less CPU.
//   - It bounds every write: amqp091 writes are not context-aware, so a
//     socket nobody reads (a silent network partition) would otherwise
//     block a publishing goroutine, and every other one behind the
//     connection's write lock, forever. A write that times out closes the
//     connection; amqp091 then shuts down, and Run reconnects. The one
//     exception is a connection the broker has blocked (a resource alarm):
//     it stopped reading on purpose and will resume, so a stalled write
//     keeps waiting, and closing the connection would only make it publish
//     again what it was about to confirm. Such a connection is still
//     watched: amqp091 drops it when the broker's heartbeats stop.
type coalescingConn struct {
	net.Conn
	timeout time.Duration
	// blocked is set while the broker blocks the connection.
	blocked atomic.Bool

	mu      sync.Mutex
	room    *sync.Cond // signalled when pending shrinks or err is set
	pending []byte
	stalled int   // Writes waiting for room
	err     error // sticky: the first write error, or net.ErrClosed
	kick    chan struct{}
	done    chan struct{} // closed when the writer goroutine returns
}

func newCoalescingConn(conn net.Conn, timeout time.Duration) *coalescingConn {
	c := &coalescingConn{Conn: conn, timeout: timeout, kick: make(chan struct{}, 1), done: make(chan struct{})}
	c.room = sync.NewCond(&c.mu)
	go c.writer()
	return c
}

// Write queues b for the writer goroutine. It reports an error the writer
// met earlier, so amqp091 learns of a dead socket on its next write at the
// latest.
func (c *coalescingConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	for c.err == nil && len(c.pending) > 0 && len(c.pending)+len(b) > maxPending {
		c.stalled++
		c.room.Wait()
		c.stalled--
	}
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return 0, err
	}
	c.pending = append(c.pending, b...)
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
	return len(b), nil
}

func (c *coalescingConn) writer() {
	defer close(c.done)
	var out []byte
	for range c.kick {
		c.mu.Lock()
		out, c.pending = c.pending, out[:0]
		err := c.err
		c.room.Broadcast()
		c.mu.Unlock()
		if err != nil {
			return
		}
		if err := c.write(out); err != nil {
			c.fail(err)
			c.Conn.Close()
			return
		}
	}
}

// write writes b under the write deadline, renewed for as long as the
// broker blocks the connection.
func (c *coalescingConn) write(b []byte) error {
	for len(b) > 0 {
		if err := c.Conn.SetWriteDeadline(time.Now().Add(c.timeout)); err != nil {
			return err
		}
		n, err := c.Conn.Write(b)
		b = b[n:]
		if err != nil && !(errors.Is(err, os.ErrDeadlineExceeded) && c.blocked.Load()) {
			return err
		}
	}
	return nil
}

// abortStalled closes the connection if a Write is waiting for room: the
// socket is not taking data, and whoever gave up on that Write cannot
// interrupt it otherwise.
func (c *coalescingConn) abortStalled() {
	c.mu.Lock()
	stalled := c.stalled > 0
	c.mu.Unlock()
	if stalled {
		_ = c.Close()
	}
}

func (c *coalescingConn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.room.Broadcast()
	c.mu.Unlock()
}

// Close closes the socket at once, dropping anything unwritten (amqp091
// closes only after its close handshake or once the connection is dead),
// and stops the writer goroutine.
func (c *coalescingConn) Close() error {
	c.fail(net.ErrClosed)
	err := c.Conn.Close()
	select {
	case c.kick <- struct{}{}:
	default:
	}
	<-c.done
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// dialer returns an amqp.Config.Dial function: TCP under DialTimeout and
// ctx, a deadline over the TLS and AMQP handshakes (amqp091 clears it once
// the connection is open), then coalesced, bounded writes. The connection
// it made last is left in *wire.
func (p *Publisher) dialer(ctx context.Context, wire **coalescingConn) func(network, addr string) (net.Conn, error) {
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
		*wire = newCoalescingConn(conn, p.cfg.ConfirmTimeout)
		return *wire, nil
	}
}
