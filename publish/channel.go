package publish

import (
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// channel is a confirm-mode AMQP channel that one Publish call at a time
// borrows from the pool. It belongs to one connection (gen).
//
// A goroutine consumes its returns at all times: amqp091 delivers a
// basic.return from the connection's reader goroutine, waits at most 5s for
// a listener to take it and then drops it, so an unconsumed return could
// be lost, and an acked-but-returned message mistaken for a routed one.
type channel struct {
	ch  *amqp.Channel
	gen uint64

	// closes receives the channel's close error (buffer 1: amqp091 sends at
	// most one) and is then closed; see closeErr.
	closes   chan *amqp.Error
	closed   bool
	closeErr *amqp.Error

	returns chan amqp.Return
	sync    chan chan []amqp.Return // collect: hand over the returns so far
	done    chan struct{}           // closed when the returns goroutine exits
	final   []amqp.Return           // returns not handed over when it exited; read after done
}

// openChannel opens a channel on conn in confirm mode and starts its returns
// goroutine through start, which tracks it (or refuses when the publisher
// is closed).
func openChannel(conn *amqp.Connection, gen uint64, start func(func()) bool) (*channel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("publish: open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("publish: confirm mode: %w", err)
	}
	c := &channel{
		ch:      ch,
		gen:     gen,
		closes:  ch.NotifyClose(make(chan *amqp.Error, 1)),
		returns: ch.NotifyReturn(make(chan amqp.Return, 128)),
		sync:    make(chan chan []amqp.Return),
		done:    make(chan struct{}),
	}
	if !start(c.drainReturns) {
		_ = ch.Close()
		return nil, ErrClosed
	}
	return c, nil
}

// drainReturns runs until amqp091 closes the returns channel, which it does
// when the channel closes, just before failing the pending confirmations.
func (c *channel) drainReturns() {
	defer close(c.done)
	var got []amqp.Return
	for {
		select {
		case r, ok := <-c.returns:
			if !ok {
				c.final = got
				return
			}
			got = append(got, r)
		case reply := <-c.sync:
			// Everything amqp091 sent before the caller's acks is buffered
			// in c.returns by now: the reader goroutine notifies a return
			// before it processes the ack that follows it.
			for drained := false; !drained; {
				select {
				case r, ok := <-c.returns:
					if !ok {
						reply <- got
						c.final = nil
						return
					}
					got = append(got, r)
				default:
					drained = true
				}
			}
			reply <- got
			got = nil
		}
	}
}

// collect returns every basic.return the broker sent on this channel before
// the confirmations the caller has already seen, and since the last
// collect.
func (c *channel) collect() []amqp.Return {
	reply := make(chan []amqp.Return, 1)
	select {
	case c.sync <- reply:
		return <-reply
	case <-c.done:
		r := c.final
		c.final = nil
		return r
	}
}

// closeError reports whether the channel has been closed, and by what
// (nil for a clean close). amqp091 sends the close error and closes the
// notification channel before it fails the pending confirmations, so once a
// confirmation says nack, this tells a real nack from a closed channel.
func (c *channel) closeError() (bool, *amqp.Error) {
	if !c.closed {
		select {
		case err := <-c.closes:
			c.closed, c.closeErr = true, err
		default:
		}
	}
	return c.closed, c.closeErr
}

// usable reports whether the channel can take another batch.
func (c *channel) usable(gen uint64) bool {
	closed, _ := c.closeError()
	return c.gen == gen && !closed && !c.ch.IsClosed()
}
