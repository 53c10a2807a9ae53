//go:build faults

package faults

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// counter is the counting consumer: it records every delivery by event
// type and message id, and when each type last saw a new id.
//
// Its queue is durable and every delivery is acknowledged only after it is
// recorded, so the queue survives a broker restart and nothing the relay
// had confirmed can vanish on the consumer's side: a delivery whose ack was
// lost with the connection comes back, flagged redelivered. The consumer
// reconnects by itself whenever its connection drops.
type counter struct {
	mu sync.Mutex
	// seen counts, per type and id, the copies the relay published: the
	// first delivery, and every later one RabbitMQ did not flag as a
	// redelivery of its own.
	seen map[string]map[string]int
	// arrived holds, per type, when the event whose payload has "n": i
	// first arrived, at index i-1 (the suite numbers each type's events
	// from 1 in commit order).
	arrived map[string][]time.Time
	// redelivered counts, per type, RabbitMQ's redeliveries of a copy
	// already recorded (its ack was lost with the connection).
	redelivered map[string]int
	// orders holds, per type relayed in ordered mode (checkOrder), the
	// tally that checks each aggregate's first arrivals are in order. It
	// sees every copy counted in seen, in the order they arrived.
	orders map[string]*testkit.OrderTally
	conn   *amqp.Connection // the current connection
	change chan struct{}
}

func newCounter(t *testing.T, exchange string) *counter {
	t.Helper()
	return newCounterOn(t, exchange, broker{urls: []string{testkit.AMQPURL()}})
}

// broker is where a counter consumes: the first of urls that answers, on
// a classic queue or, with quorum, a quorum queue (whose exchange it then
// declares too, as a durable topic exchange, since the relay may not have
// yet).
type broker struct {
	urls   []string
	quorum bool
}

// newCounterOn is newCounter on b.
func newCounterOn(t *testing.T, exchange string, b broker) *counter {
	t.Helper()
	c := &counter{seen: map[string]map[string]int{}, arrived: map[string][]time.Time{}, redelivered: map[string]int{},
		orders: map[string]*testkit.OrderTally{}, change: make(chan struct{}, 1)}
	queue := testkit.UniqueName("outboxrelay_faults")
	// The first connection is made here, so that a broker that is not
	// there fails the test at once; the later ones in the background.
	conn, deliveries, err := dial(b, queue, exchange)
	if err != nil {
		t.Fatalf("counting consumer: %v", err)
	}
	c.conn = conn
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c.record(deliveries)
			conn.Close()
			for {
				conn, deliveries, err = dial(b, queue, exchange)
				if err == nil {
					break
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
			c.mu.Lock()
			c.conn = conn
			c.mu.Unlock()
			if ctx.Err() != nil {
				conn.Close()
				return
			}
		}
	})
	t.Cleanup(func() {
		cancel()
		c.mu.Lock()
		conn := c.conn
		c.mu.Unlock()
		conn.Close() // ends record; a connection dialled after cancel closes itself
		wg.Wait()
		if conn, err := connect(b); err == nil {
			if ch, err := conn.Channel(); err == nil {
				_, _ = ch.QueueDelete(queue, false, false, false)
			}
			conn.Close()
		}
	})
	return c
}

// dial connects, declares the durable queue bound to every routing key of
// exchange (idempotent) and starts consuming it with manual acks.
func dial(b broker, queue, exchange string) (*amqp.Connection, <-chan amqp.Delivery, error) {
	conn, err := connect(b)
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	var args amqp.Table
	if b.quorum {
		args = amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}
		if err == nil {
			err = ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil)
		}
	}
	if err == nil {
		_, err = ch.QueueDeclare(queue, true, false, false, false, args)
	}
	if err == nil {
		err = ch.QueueBind(queue, "#", exchange, false, nil)
	}
	if err == nil {
		err = ch.Qos(2000, 0, false)
	}
	var deliveries <-chan amqp.Delivery
	if err == nil {
		deliveries, err = ch.Consume(queue, "", false, false, false, false, nil)
	}
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, deliveries, nil
}

// connect connects to the first of b's URLs that answers.
func connect(b broker) (*amqp.Connection, error) {
	var err error
	for _, u := range b.urls {
		var conn *amqp.Connection
		if conn, err = amqp.Dial(u); err == nil {
			return conn, nil
		}
	}
	return nil, err
}

// record counts deliveries, acknowledging them once counted, 256 at a
// time or after 5 ms without a delivery, until the channel closes with its
// connection.
func (c *counter) record(deliveries <-chan amqp.Delivery) {
	var (
		last    amqp.Delivery
		unacked int
		idle    = time.NewTimer(time.Hour)
	)
	defer idle.Stop()
	for {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return
			}
			c.count(d)
			last = d
			if unacked++; unacked >= 256 {
				_ = last.Ack(true)
				unacked = 0
			}
			idle.Reset(5 * time.Millisecond)
		case <-idle.C:
			if unacked > 0 {
				// A lost ack means a redelivery, which is counted apart.
				_ = last.Ack(true)
				unacked = 0
			}
		}
	}
}

// checkOrder makes the counter check the order of first arrivals of
// events of type tag, whose payloads number each aggregate's events as
// "seq" (testkit.OrderChecker), and returns the tally that does.
func (c *counter) checkOrder(tag string) *testkit.OrderTally {
	c.mu.Lock()
	defer c.mu.Unlock()
	o := testkit.NewOrderTally()
	c.orders[tag] = o
	return o
}

// count records one delivery.
func (c *counter) count(d amqp.Delivery) {
	c.mu.Lock()
	order := c.orders[d.Type]
	ids := c.seen[d.Type]
	if ids == nil {
		ids = map[string]int{}
		c.seen[d.Type] = ids
	}
	switch {
	case ids[d.MessageId] == 0:
		ids[d.MessageId] = 1
		var body struct{ N int }
		if json.Unmarshal(d.Body, &body) == nil && body.N > 0 {
			at := c.arrived[d.Type]
			for len(at) < body.N {
				at = append(at, time.Time{})
			}
			at[body.N-1] = time.Now()
			c.arrived[d.Type] = at
		}
	case d.Redelivered:
		c.redelivered[d.Type]++
		order = nil // RabbitMQ's copy, not the relay's
	default:
		ids[d.MessageId]++
	}
	c.mu.Unlock()
	if order != nil {
		order.Add(d) // record is the only caller: in arrival order
	}
	select {
	case c.change <- struct{}{}:
	default:
	}
}

// redeliveries is how many copies of events of type tag RabbitMQ
// delivered again because their ack was lost: not relay duplicates.
func (c *counter) redeliveries(tag string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.redelivered[tag]
}

// stats returns the distinct events of type tag delivered and the
// duplicate copies the relay published.
func (c *counter) stats(tag string) (distinct, duplicates int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.seen[tag] {
		distinct++
		duplicates += n - 1
	}
	return distinct, duplicates
}

// caughtUp is when the last of events 1 to upto of type tag arrived, and
// whether all of them have.
func (c *counter) caughtUp(tag string, upto int) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	at := c.arrived[tag]
	if len(at) < upto {
		return time.Time{}, false
	}
	var last time.Time
	for _, t := range at[:upto] {
		if t.IsZero() {
			return time.Time{}, false
		}
		if t.After(last) {
			last = t
		}
	}
	return last, true
}

// lastArrival is when the last of the events of type tag numbered ns
// first arrived, and whether all of them have.
func (c *counter) lastArrival(tag string, ns []int) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	at := c.arrived[tag]
	var last time.Time
	for _, n := range ns {
		if n > len(at) || at[n-1].IsZero() {
			return time.Time{}, false
		}
		if at[n-1].After(last) {
			last = at[n-1]
		}
	}
	return last, true
}

// missing returns those of the events of type tag numbered ns that have
// not arrived.
func (c *counter) missing(tag string, ns []int) []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	at := c.arrived[tag]
	var out []int
	for _, n := range ns {
		if n > len(at) || at[n-1].IsZero() {
			out = append(out, n)
		}
	}
	return out
}

// distinct is how many distinct events of type tag arrived.
func (c *counter) distinct(tag string) int {
	d, _ := c.stats(tag)
	return d
}

// waitDistinct waits until at least n distinct events of type tag arrived,
// and fails the test if they do not within timeout.
func (c *counter) waitDistinct(t *testing.T, tag string, n int, timeout time.Duration) {
	t.Helper()
	if !c.awaitDistinct(tag, n, timeout) {
		t.Fatalf("%s: %d of %d events delivered within %s", tag, c.distinct(tag), n, timeout)
	}
}

// awaitDistinct waits until at least n distinct events of type tag
// arrived, and reports whether they did within timeout.
func (c *counter) awaitDistinct(tag string, n int, timeout time.Duration) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for c.distinct(tag) < n {
		select {
		case <-c.change:
		case <-deadline.C:
			return false
		}
	}
	return true
}
