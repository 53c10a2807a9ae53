package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/outboxrelay/outboxrelay/internal/redact"
	amqp "github.com/rabbitmq/amqp091-go"
)

// consumer receives everything published to the benchmark exchange on an
// exclusive, auto-deleted queue bound with "#", with automatic
// acknowledgements, and notes each event's arrival in the record it tracks
// (for a record that checks order, with the aggregate and seq the message
// says it has).
type consumer struct {
	conn    *amqp.Connection
	ch      *amqp.Channel
	queue   string
	clock   clock
	tracked atomic.Pointer[record]
	// createdExchange tells whether the exchange was declared by the
	// benchmark rather than found.
	createdExchange bool
	// sentinels receives the id of each barrier sentinel as it arrives.
	sentinels chan string
	nextBar   int
	closed    chan *amqp.Error
	done      chan struct{}
	err       error // set before done closes
}

const sentinelPrefix = "bench-sentinel-"

// newConsumer declares the exchange (durable topic, as the relay does) and
// the queue, and starts consuming.
func newConsumer(amqpURL, exchange string, clk clock) (*consumer, error) {
	conn, err := dialAMQP(amqpURL, "outboxrelay-bench-consumer")
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	c := &consumer{conn: conn, clock: clk, sentinels: make(chan string, 8), done: make(chan struct{})}
	deliveries, err := c.setup(exchange)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("consumer: %w", err)
	}
	go c.run(deliveries)
	return c, nil
}

func (c *consumer) setup(exchange string) (<-chan amqp.Delivery, error) {
	ch, err := c.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	c.ch = ch
	c.closed = ch.NotifyClose(make(chan *amqp.Error, 1))
	existed, err := c.exchangeExists(exchange)
	if err != nil {
		return nil, err
	}
	c.createdExchange = !existed
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return nil, fmt.Errorf("declare exchange %q: %w", exchange, err)
	}
	q, err := ch.QueueDeclare("outboxrelay-bench-"+randomHex(6), false, true, true, false, nil)
	if err != nil {
		return nil, fmt.Errorf("declare queue: %w", err)
	}
	c.queue = q.Name
	if err := ch.QueueBind(q.Name, "#", exchange, false, nil); err != nil {
		return nil, fmt.Errorf("bind queue to %q: %w", exchange, err)
	}
	deliveries, err := ch.Consume(q.Name, "outboxrelay-bench", true, true, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("consume: %w", err)
	}
	return deliveries, nil
}

// exchangeExists declares the exchange passively on a channel of its own:
// a missing exchange makes the broker close the channel.
func (c *consumer) exchangeExists(exchange string) (bool, error) {
	ch, err := c.conn.Channel()
	if err != nil {
		return false, fmt.Errorf("open channel: %w", err)
	}
	err = ch.ExchangeDeclarePassive(exchange, amqp.ExchangeTopic, true, false, false, false, nil)
	var aerr *amqp.Error
	switch {
	case err == nil:
		return true, ch.Close()
	case errors.As(err, &aerr) && aerr.Code == amqp.NotFound:
		return false, nil
	default:
		return false, fmt.Errorf("check exchange %q: %w", exchange, err)
	}
}

// run notes deliveries until the channel closes.
func (c *consumer) run(deliveries <-chan amqp.Delivery) {
	for d := range deliveries {
		t := c.clock.now()
		if n, ok := parseEventID(d.MessageId); ok {
			if rec := c.tracked.Load(); rec != nil { // events of no record are ignored
				var l place
				if rec.order != nil {
					l = placeOf(d.Headers["aggregate_id"], d.Body)
				}
				rec.receive(n, t, l)
			}
			continue
		}
		if strings.HasPrefix(d.MessageId, sentinelPrefix) {
			select {
			case c.sentinels <- d.MessageId:
			default: // nobody waits for it
			}
		}
	}
	c.err = errors.New("consumer: deliveries ended")
	select {
	case e := <-c.closed:
		if e != nil {
			c.err = fmt.Errorf("consumer: channel closed: %w", e)
		}
	default:
	}
	close(c.done)
}

// track makes the consumer note arrivals in rec from now on; nil ignores
// them.
func (c *consumer) track(rec *record) { c.tracked.Store(rec) }

// Done is closed when the consumer stops; Err then says why.
func (c *consumer) Done() <-chan struct{} { return c.done }

// Err is why the consumer stopped; call it after Done.
func (c *consumer) Err() error { return c.err }

// purge drops what is queued, then waits until everything already delivered
// or on its way has passed through the consumer: it sends a sentinel
// straight to the queue, which is FIFO, and waits for it to come back.
func (c *consumer) purge(ctx context.Context, timeout time.Duration) error {
	if _, err := c.ch.QueuePurge(c.queue, false); err != nil {
		return fmt.Errorf("purge queue: %w", err)
	}
	c.nextBar++
	id := sentinelPrefix + strconv.Itoa(c.nextBar)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := c.ch.PublishWithContext(ctx, "", c.queue, false, false, amqp.Publishing{MessageId: id}); err != nil {
		return fmt.Errorf("publish sentinel: %w", err)
	}
	for {
		select {
		case got := <-c.sentinels:
			if got == id {
				return nil
			}
		case <-c.done:
			return c.err
		case <-ctx.Done():
			return fmt.Errorf("sentinel: %w", ctx.Err())
		}
	}
}

// Close stops consuming (the queue goes with the connection) and waits for
// the consumer to finish.
func (c *consumer) Close() error {
	err := c.conn.CloseDeadline(time.Now().Add(10 * time.Second))
	<-c.done
	if err != nil && !errors.Is(err, amqp.ErrClosed) {
		return fmt.Errorf("consumer: close: %w", err)
	}
	return nil
}

// dialAMQP connects to RabbitMQ with a connection name the management UI
// shows.
func dialAMQP(amqpURL, name string) (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(name)
	conn, err := amqp.DialConfig(amqpURL, amqp.Config{
		Heartbeat:  10 * time.Second,
		Locale:     "en_US",
		Dial:       amqp.DefaultDial(15 * time.Second),
		Properties: props,
	})
	if err != nil {
		return nil, fmt.Errorf("dial RabbitMQ at %s: %w", redact.URL(amqpURL), redact.Error(err, amqpURL))
	}
	return conn, nil
}
