package testkit

import (
	"cmp"
	"net/url"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// DefaultAMQPURL is the broker the suite uses.
const DefaultAMQPURL = "amqp://guest:guest@127.0.0.1:5672/"

// AMQPURL is TEST_AMQP_URL, or DefaultAMQPURL.
func AMQPURL() string {
	return cmp.Or(os.Getenv("TEST_AMQP_URL"), DefaultAMQPURL)
}

func dialAMQP(t testing.TB) (*amqp.Connection, *amqp.Channel) {
	t.Helper()
	conn, err := amqp.Dial(AMQPURL())
	if err != nil {
		t.Fatalf("testkit: dial RabbitMQ: %v", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		t.Fatalf("testkit: open channel: %v", err)
	}
	return conn, ch
}

// NewExchange declares a topic exchange unique to this test and deletes it
// when the test ends.
func NewExchange(t testing.TB) string {
	t.Helper()
	name := UniqueName("outboxrelay_test")
	conn, ch := dialAMQP(t)
	defer conn.Close()
	if err := ch.ExchangeDeclare(name, "topic", true, false, false, false, nil); err != nil {
		t.Fatalf("testkit: declare exchange %s: %v", name, err)
	}
	t.Cleanup(func() { DeleteExchange(t, name) })
	return name
}

// DeleteExchange deletes an exchange if it exists.
func DeleteExchange(t testing.TB, name string) {
	t.Helper()
	conn, ch := dialAMQP(t)
	defer conn.Close()
	if err := ch.ExchangeDelete(name, false, false); err != nil {
		t.Errorf("testkit: delete exchange %s: %v", name, err)
	}
}

// Queue is an exclusive queue bound to an exchange, consumed with automatic
// acknowledgements. It is deleted when the test ends.
type Queue struct {
	Name       string
	Deliveries <-chan amqp.Delivery
	ch         *amqp.Channel
}

// NewQueue declares an exclusive queue bound to exchange with bindingKey
// ("#" takes everything) and starts consuming it.
func NewQueue(t testing.TB, exchange, bindingKey string) *Queue {
	t.Helper()
	conn, ch := dialAMQP(t)
	t.Cleanup(func() { conn.Close() })
	q, err := ch.QueueDeclare(UniqueName("outboxrelay_test"), false, true, true, false, nil)
	if err != nil {
		t.Fatalf("testkit: declare queue: %v", err)
	}
	if err := ch.QueueBind(q.Name, bindingKey, exchange, false, nil); err != nil {
		t.Fatalf("testkit: bind queue %s to %s: %v", q.Name, exchange, err)
	}
	if err := ch.Qos(1000, 0, false); err != nil {
		t.Fatalf("testkit: qos: %v", err)
	}
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatalf("testkit: consume %s: %v", q.Name, err)
	}
	pubCh, err := conn.Channel()
	if err != nil {
		t.Fatalf("testkit: open channel: %v", err)
	}
	return &Queue{Name: q.Name, Deliveries: deliveries, ch: pubCh}
}

// BindNew declares a durable topic exchange and binds the queue to it with
// bindingKey, on the queue's own connection (the queue is exclusive to
// it): an exchange that appears late, for a test of events whose per-row
// exchange was missing. The exchange is deleted when the test ends.
func (q *Queue) BindNew(t testing.TB, exchange, bindingKey string) {
	t.Helper()
	if err := q.ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil); err != nil {
		t.Fatalf("testkit: declare exchange %s: %v", exchange, err)
	}
	t.Cleanup(func() { DeleteExchange(t, exchange) })
	if err := q.ch.QueueBind(q.Name, bindingKey, exchange, false, nil); err != nil {
		t.Fatalf("testkit: bind queue %s to %s: %v", q.Name, exchange, err)
	}
}

// Receive returns the next n deliveries, failing the test if they do not all
// arrive within timeout.
func (q *Queue) Receive(t testing.TB, n int, timeout time.Duration) []amqp.Delivery {
	t.Helper()
	out := make([]amqp.Delivery, 0, n)
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for len(out) < n {
		select {
		case d, ok := <-q.Deliveries:
			if !ok {
				t.Fatalf("testkit: queue %s closed after %d of %d deliveries", q.Name, len(out), n)
			}
			out = append(out, d)
		case <-deadline.C:
			t.Fatalf("testkit: queue %s: %d of %d deliveries within %s", q.Name, len(out), n, timeout)
		}
	}
	return out
}

// Drain returns every delivery still on its way, up to a barrier: it sends a
// sentinel straight to the queue and reads until the sentinel arrives. A
// queue is FIFO, so whatever was enqueued before the call has been returned.
func (q *Queue) Drain(t testing.TB, timeout time.Duration) []amqp.Delivery {
	t.Helper()
	sentinel := UniqueName("sentinel")
	if err := q.ch.Publish("", q.Name, false, false, amqp.Publishing{MessageId: sentinel}); err != nil {
		t.Fatalf("testkit: publish sentinel: %v", err)
	}
	var out []amqp.Delivery
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		select {
		case d, ok := <-q.Deliveries:
			if !ok {
				t.Fatalf("testkit: queue %s closed while draining", q.Name)
			}
			if d.MessageId == sentinel {
				return out
			}
			out = append(out, d)
		case <-deadline.C:
			t.Fatalf("testkit: queue %s: sentinel not back within %s", q.Name, timeout)
		}
	}
}

// Counter counts deliveries by message id.
type Counter map[string]int

// Add counts deliveries.
func (c Counter) Add(ds []amqp.Delivery) {
	for _, d := range ds {
		c[d.MessageId]++
	}
}

// Duplicates is how many deliveries repeated an id already seen.
func (c Counter) Duplicates() int {
	n := 0
	for _, k := range c {
		n += k - 1
	}
	return n
}

// NewAMQPProxy starts a Proxy in front of the test broker and returns it
// with the broker URL rewritten to go through it.
func NewAMQPProxy(t testing.TB) (*Proxy, string) {
	t.Helper()
	u, err := url.Parse(AMQPURL())
	if err != nil {
		t.Fatalf("testkit: parse AMQP URL: %v", err)
	}
	proxy := NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	return proxy, u.String()
}
