package inbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	amqp "github.com/rabbitmq/amqp091-go"
)

const (
	// opTimeout bounds each database and broker call of the consumer's own
	// (acquiring a connection, commit, rollback, the failure record, a
	// cleanup batch, cancel), not the handler, nor the batch of BEGIN and
	// the record, which may wait on a concurrent copy's row lock as long as
	// that copy's handler runs.
	opTimeout = 30 * time.Second
	// dialTimeout bounds connecting to the broker.
	dialTimeout = 10 * time.Second
	// heartbeat is the AMQP heartbeat: a dead connection is noticed after
	// two missed ones.
	heartbeat = 10 * time.Second
)

// Run dials the broker, consumes Config.Queue and runs the handler for each
// delivery until ctx is cancelled, reconnecting with backoff (exponential,
// jittered, without end) after a cut connection or channel; it runs the
// cleanup every Config.CleanupInterval. It returns an error only when,
// before it has consumed once, the broker answers that the queue is missing
// or access is refused, or closes the handshake 3 times in a row (how
// RabbitMQ refuses a login; one such close may be a cut connection); after
// that, failures are logged and retried. When ctx is cancelled, Run stops
// taking deliveries (those prefetched and not started go back to the
// queue), lets the handlers in flight finish for up to
// Config.ShutdownTimeout, then cancels their context (their transactions
// roll back and their deliveries are not acked: the broker redelivers
// them), waits for them to return, and returns nil.
//
// Run may be called again after it returned; two concurrent Runs of one
// Consumer are two consumers of the queue.
func (c *Consumer) Run(ctx context.Context) error {
	// hctx is the handlers' context: not cancelled with ctx, so that the
	// handlers in flight can finish, but ShutdownTimeout after it.
	hctx, hardStop := context.WithCancel(context.WithoutCancel(ctx))
	defer hardStop()
	exit := make(chan struct{})
	var background sync.WaitGroup
	background.Add(1)
	go func() {
		defer background.Done()
		select {
		case <-ctx.Done():
		case <-exit:
			return
		}
		t := time.NewTimer(c.cfg.ShutdownTimeout)
		defer t.Stop()
		select {
		case <-t.C:
			c.log.Warn("shutdown timeout: cancelling the handlers still running; their deliveries go back to the queue",
				"shutdown_timeout", c.cfg.ShutdownTimeout)
			hardStop()
		case <-exit:
		}
	}()
	cleanupCtx, stopCleanup := context.WithCancel(ctx)
	if c.cfg.CleanupInterval > 0 {
		background.Add(1)
		go func() {
			defer background.Done()
			c.runCleanup(cleanupCtx)
		}()
	}
	defer func() {
		stopCleanup()
		close(exit)
		background.Wait()
	}()

	var handlers sync.WaitGroup
	defer handlers.Wait()
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 200 * time.Millisecond
	bo.MaxInterval = 15 * time.Second
	bo.MaxElapsedTime = 0 // a daemon never gives up
	retry := backoff.WithContext(bo, ctx)
	refusals := 0 // handshakes in a row the broker closed without a reply
	for first := true; ; {
		consumed, err := c.session(ctx, hctx, &handlers)
		if ctx.Err() != nil {
			return nil
		}
		if handshakeClosed(err) {
			refusals++
		} else {
			refusals = 0
		}
		if first && !consumed && (permanent(err) || refusals == handshakeRefusals) {
			return err
		}
		if consumed {
			first = false
			bo.Reset()
		}
		delay := retry.NextBackOff()
		c.log.Warn("consumer disconnected; reconnecting", "error", err, "retry_in", delay)
		if delay == backoff.Stop || !sleep(ctx, delay) {
			return nil
		}
	}
}

// permanent tells the errors, answered by the broker itself, that a first
// connection gives up on: the queue does not exist, or the user may not
// consume it.
func permanent(err error) bool {
	var e *amqp.Error
	return errors.As(err, &e) && e.Server && (e.Code == amqp.NotFound || e.Code == amqp.AccessRefused)
}

// handshakeRefusals is how many handshakes in a row a first connection sees
// closed without a reply before it takes them for wrong credentials.
const handshakeRefusals = 3

// handshakeClosed tells a handshake the broker closed without a reply.
// amqp091-go reports it as ErrCredentials or ErrVhost, because RabbitMQ
// closes the socket that way on a refused login; but a connection cut
// during the handshake looks the same, so one of them proves nothing.
func handshakeClosed(err error) bool {
	return errors.Is(err, amqp.ErrCredentials) || errors.Is(err, amqp.ErrVhost)
}

// session consumes on one connection until it fails (an error) or ctx is
// cancelled (nil, after the graceful shutdown). consumed tells whether it
// got as far as consuming.
func (c *Consumer) session(ctx, hctx context.Context, handlers *sync.WaitGroup) (consumed bool, err error) {
	conn, err := amqp.DialConfig(c.cfg.AMQPURL, amqp.Config{
		Heartbeat:  heartbeat,
		Locale:     "en_US",
		Dial:       amqp.DefaultDial(dialTimeout),
		Properties: amqp.Table{"connection_name": "inbox " + c.cfg.Name},
	})
	if err != nil {
		return false, fmt.Errorf("inbox: dial %s: %w", c.broker, err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return false, fmt.Errorf("inbox: open channel: %w", err)
	}
	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return false, fmt.Errorf("inbox: set prefetch %d: %w", c.cfg.Prefetch, err)
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	tag := "inbox-" + c.cfg.Name + "-" + strconv.FormatUint(rand.Uint64(), 36)
	deliveries, err := ch.Consume(c.cfg.Queue, tag, false, false, false, false, nil)
	if err != nil {
		return false, fmt.Errorf("inbox: consume queue %q: %w", c.cfg.Queue, err)
	}
	c.log.Info("consuming", "broker", c.broker, "prefetch", c.cfg.Prefetch)
	for {
		select {
		case <-ctx.Done():
			c.shutdown(ch, tag, deliveries, closed, handlers)
			return true, nil
		case e := <-closed:
			if e == nil {
				return true, errors.New("inbox: channel closed")
			}
			return true, fmt.Errorf("inbox: channel closed: %w", e)
		case d, ok := <-deliveries:
			if !ok {
				return true, errors.New("inbox: the broker cancelled the consumer")
			}
			handlers.Add(1)
			go func() {
				defer handlers.Done()
				c.deliver(ctx, hctx, d)
			}()
		}
	}
}

// shutdown stops the consumer, returns the deliveries it got and did not
// start to the queue, and waits for the handlers in flight, so that they
// can ack on this channel.
func (c *Consumer) shutdown(ch *amqp.Channel, tag string, deliveries <-chan amqp.Delivery, closed <-chan *amqp.Error, handlers *sync.WaitGroup) {
	c.log.Info("shutting down: waiting for the handlers in flight", "shutdown_timeout", c.cfg.ShutdownTimeout)
	if err := ch.Cancel(tag, false); err != nil {
		c.log.Debug("cancel consumer", "error", err)
	}
	timeout := time.NewTimer(opTimeout)
	defer timeout.Stop()
drain:
	for {
		select {
		case d, ok := <-deliveries:
			if !ok {
				break drain
			}
			c.nack(d)
		case <-closed:
			break drain
		case <-timeout.C:
			break drain
		}
	}
	handlers.Wait()
}

// sleep waits for d, and reports false if ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
