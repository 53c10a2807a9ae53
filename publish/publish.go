package publish

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Publish sends a batch and waits for the broker to confirm it. The result
// has one error per message, in order; nil means the broker confirmed the
// message and did not return it as unroutable.
//
// The whole batch is sent on one confirm channel borrowed from the pool,
// then every confirmation is awaited. One deadline, ConfirmTimeout (or
// ctx's, if sooner), covers the batch from the exchange checks to the last
// confirmation, so a silently dead connection cannot hold Publish longer.
// While the broker blocks the connection (a resource alarm) the deadline
// stands still: the broker has stopped reading on purpose, and the batch
// waits for its confirmations instead of failing and being published
// twice. It restarts in full once the connection is unblocked. ctx ends
// the wait at any time.
//
// A message fails on its own with ErrInvalid, ErrExchangeNotFound,
// ErrReturned or ErrNacked; the others of the batch are unaffected. If the
// channel or connection is lost, or the deadline passes, every unconfirmed
// message fails with that error. If the publisher is not connected (or the
// connection is blocked), every message fails at once with ErrNotConnected.
func (p *Publisher) Publish(ctx context.Context, msgs []Message) []error {
	errs := make([]error, len(msgs))
	exchanges := make([]string, len(msgs))
	todo := make([]int, 0, len(msgs))
	for i := range msgs {
		exchanges[i] = cmp.Or(msgs[i].Exchange, p.cfg.Exchange)
		if err := msgs[i].validate(exchanges[i], p.cfg.MaxMessageSize); err != nil {
			errs[i] = err
			continue
		}
		todo = append(todo, i)
	}
	if spans := p.startSpans(ctx, msgs, exchanges); spans != nil {
		defer endSpans(spans, errs)
	}
	if len(todo) == 0 {
		return errs
	}

	conn, gen, wire, err := p.current()
	if err != nil {
		fail(errs, todo, err)
		return errs
	}
	// One deadline for the whole batch: checks, channel, sending, confirms.
	ctx, cancel := p.batchContext(ctx, gen)
	defer cancel()
	todo = p.checkExchanges(ctx, conn, gen, exchanges, todo, errs)
	if len(todo) == 0 {
		return errs
	}
	c, err := p.borrow(ctx, conn, gen)
	if err != nil {
		fail(errs, todo, err)
		return errs
	}
	reusable := p.send(ctx, c, wire, msgs, exchanges, todo, errs)
	p.release(c, reusable)
	return errs
}

func fail(errs []error, idx []int, err error) {
	for _, i := range idx {
		errs[i] = err
	}
}

// current is the connection to publish on, with its generation and
// socket, or why there is none.
func (p *Publisher) current() (*amqp.Connection, uint64, *coalescingConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		return nil, 0, nil, ErrClosed
	case p.conn == nil:
		return nil, 0, nil, ErrNotConnected
	case p.isBlock:
		return nil, 0, nil, fmt.Errorf("%w: connection blocked by broker: %s", ErrNotConnected, p.blocked)
	}
	return p.conn, p.gen, p.wire, nil
}

// batchContext is ctx with a batch's deadline: ConfirmTimeout, counted
// only while the broker does not block connection gen. A blocked
// connection has stopped reading on purpose (a resource alarm); the
// batch's confirmations come once the alarm clears, and giving up on them
// would only publish the batch twice. The deadline starts afresh when the
// broker unblocks the connection; a connection lost while blocked fails
// the batch through its closed channel, and the caller's ctx still ends it
// at any time.
func (p *Publisher) batchContext(ctx context.Context, gen uint64) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		timer := time.NewTimer(p.cfg.ConfirmTimeout)
		defer timer.Stop()
		wasBlocked := false
		for {
			p.mu.Lock()
			blocked := p.isBlock && p.conn != nil && p.gen == gen
			changed := p.changed
			p.mu.Unlock()
			switch {
			case blocked && !wasBlocked:
				timer.Stop()
			case !blocked && wasBlocked:
				timer.Reset(p.cfg.ConfirmTimeout)
			}
			wasBlocked = blocked
			select {
			case <-ctx.Done():
				return
			case <-changed:
			case <-timer.C:
				cancel(p.timeout)
				return
			}
		}
	}()
	return ctx, func() {
		cancel(context.Canceled)
		<-done
	}
}

// checkExchanges makes sure each exchange of the batch exists before
// anything is published: a publish to a missing exchange makes the broker
// close the channel, and the rest of the batch with it. Known exchanges are
// cached; the others are declared passively (or, for the default exchange,
// declared) on the scratch channel. It fails the messages whose exchange is
// missing or could not be checked, and returns the rest of todo.
func (p *Publisher) checkExchanges(ctx context.Context, conn *amqp.Connection, gen uint64, exchanges []string, todo []int, errs []error) []int {
	var unknown map[string]error
	p.mu.Lock()
	for _, i := range todo {
		if name := exchanges[i]; !p.known[name] {
			if unknown == nil {
				unknown = make(map[string]error)
			}
			unknown[name] = nil
		}
	}
	p.mu.Unlock()
	if unknown == nil {
		return todo
	}
	for name := range unknown {
		unknown[name] = p.checkExchange(ctx, conn, gen, name)
	}
	kept := todo[:0]
	for _, i := range todo {
		if err := unknown[exchanges[i]]; err != nil {
			errs[i] = err
			continue
		}
		kept = append(kept, i)
	}
	return kept
}

// checkExchange declares name passively (or, for the default exchange,
// declares it) on the scratch channel, one check at a time. The round trip
// runs in its own goroutine so that ctx bounds the wait even on a silently
// dead connection; an abandoned check finishes (or fails with the
// connection) on its own.
func (p *Publisher) checkExchange(ctx context.Context, conn *amqp.Connection, gen uint64, name string) error {
	select {
	case p.scratchSem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("publish: check exchange %q: %w", name, context.Cause(ctx))
	}
	res := make(chan error)
	check := func() {
		err := p.declareOnScratch(conn, gen, name)
		<-p.scratchSem
		select {
		case res <- err:
		case <-ctx.Done():
		}
	}
	if !p.start(check) {
		<-p.scratchSem
		return ErrClosed
	}
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return fmt.Errorf("publish: check exchange %q: %w", name, context.Cause(ctx))
	}
}

// declareOnScratch runs with p.scratchSem held.
func (p *Publisher) declareOnScratch(conn *amqp.Connection, gen uint64, name string) error {
	p.mu.Lock()
	known, scratch, scratchOf := p.known[name], p.scratch, p.scratchOf
	p.mu.Unlock()
	if known {
		return nil
	}
	if scratchOf > gen {
		return fmt.Errorf("publish: check exchange %q: %w", name, ErrNotConnected)
	}
	if scratch == nil || scratchOf != gen || scratch.IsClosed() {
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("publish: check exchange %q: open channel: %w", name, err)
		}
		p.mu.Lock()
		if p.scratchOf > gen {
			// Reconnected meanwhile; ch belongs to the dead connection.
			p.mu.Unlock()
			return fmt.Errorf("publish: check exchange %q: %w", name, ErrNotConnected)
		}
		scratch, p.scratch, p.scratchOf = ch, ch, gen
		p.mu.Unlock()
	}
	var err error
	if name == p.cfg.Exchange && !p.cfg.SkipDeclare {
		// The default exchange was declared at connect; it has since been
		// deleted (a publish to it got a 404), so declare it again.
		err = p.declare(scratch)
	} else {
		err = scratch.ExchangeDeclarePassive(name, amqp.ExchangeTopic, true, false, false, false, nil)
	}
	if err != nil {
		// A failed declaration closed the scratch channel; the next check
		// opens another.
		var aerr *amqp.Error
		if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
			return fmt.Errorf("%w: %q", ErrExchangeNotFound, name)
		}
		return fmt.Errorf("publish: check exchange %q: %w", name, err)
	}
	p.mu.Lock()
	p.known[name] = true
	p.mu.Unlock()
	return nil
}

// forget drops exchanges from the cache of known ones, so the next batch
// checks them again.
func (p *Publisher) forget(exchanges []string, todo []int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, i := range todo {
		delete(p.known, exchanges[i])
	}
}

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

// pending is one sent message and its confirmation.
type pending struct {
	i  int
	dc *amqp.DeferredConfirmation
}

// send publishes msgs[todo] on c, awaits their confirmations until ctx
// (the batch deadline) ends, and fills errs. It reports whether c may take
// another batch: no confirmation may still be outstanding on it, or a late
// one could be taken for the next batch's.
func (p *Publisher) send(ctx context.Context, c *channel, wire *coalescingConn, msgs []Message, exchanges []string, todo []int, errs []error) bool {
	sent := make([]pending, 0, len(todo))
	var sendErr error
	// amqp091 cannot interrupt a publish waiting for the socket: if ctx
	// ends while one does, the socket is stalled (the deadline only runs
	// while the broker is not blocking the connection, or the caller gave
	// up), so close it: the publish fails and Run reconnects. Checked until
	// the loop is done, as a publish may start to wait just after ctx ends.
	sending := make(chan struct{})
	stopAbort := context.AfterFunc(ctx, func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			wire.abortStalled()
			select {
			case <-sending:
				return
			case <-tick.C:
			}
		}
	})
	for k, i := range todo {
		m := &msgs[i]
		dc, err := c.ch.PublishWithDeferredConfirmWithContext(ctx, exchanges[i], m.RoutingKey, true, false, amqp.Publishing{
			Headers:      m.Headers,
			ContentType:  "application/json",
			DeliveryMode: amqp.Persistent,
			MessageId:    m.MessageID,
			Timestamp:    m.Timestamp,
			Type:         m.Type,
			Body:         m.Body,
		})
		if err != nil {
			if ctx.Err() != nil {
				err = context.Cause(ctx)
			}
			sendErr = fmt.Errorf("publish: send: %w", err)
			fail(errs, todo[k:], sendErr)
			break
		}
		sent = append(sent, pending{i: i, dc: dc})
	}
	close(sending)
	stopAbort()
	if p.afterSend != nil {
		p.afterSend()
	}

wait:
	for _, s := range sent {
		select {
		case <-s.dc.Done():
		case <-ctx.Done():
			break wait
		}
	}

	unconfirmed, nacked := 0, 0
	var closeErr error
	for _, s := range sent {
		select {
		case <-s.dc.Done():
		default:
			unconfirmed++
			errs[s.i] = fmt.Errorf("publish: unconfirmed: %w", context.Cause(ctx))
			continue
		}
		if s.dc.Acked() {
			continue
		}
		if closed, err := c.closeError(); closed {
			if closeErr == nil {
				closeErr = fmt.Errorf("publish: unconfirmed: channel closed: %w", amqp.ErrClosed)
				if err != nil {
					closeErr = fmt.Errorf("publish: unconfirmed: channel closed: %w", err)
				}
			}
			errs[s.i] = closeErr
			continue
		}
		nacked++
		errs[s.i] = ErrNacked
	}

	returned := p.matchReturns(c.collect(), sent, exchanges, msgs, errs)

	closed, cerr := c.closeError()
	if cerr != nil && cerr.Code == amqp.NotFound {
		// An exchange of the batch was deleted since it was checked.
		p.forget(exchanges, todo)
	}
	switch {
	case unconfirmed > 0:
		p.log.Warn("batch not confirmed in time", "err", context.Cause(ctx), "unconfirmed", unconfirmed, "batch", len(todo))
	case closeErr != nil || sendErr != nil:
		p.log.Warn("channel lost mid-batch", "err", cmp.Or(closeErr, sendErr), "batch", len(todo))
	case nacked > 0 || returned > 0:
		p.log.Debug("batch partly refused", "nacked", nacked, "returned", returned, "batch", len(todo))
	}
	// Reusable only with nothing outstanding, and not after a failed write
	// (a send that failed because ctx ended wrote nothing).
	return unconfirmed == 0 && !closed && (sendErr == nil || ctx.Err() != nil)
}

// matchReturns fails the returned messages of the batch with ErrReturned. A
// basic.return names the message only by its properties, so returns are
// matched by message id, exchange and routing key; among messages sharing
// all three, in publish order (the order the broker returns them in).
func (p *Publisher) matchReturns(returns []amqp.Return, sent []pending, exchanges []string, msgs []Message, errs []error) int {
	if len(returns) == 0 {
		return 0
	}
	type key struct{ id, exchange, routingKey string }
	byKey := make(map[key][]int, len(returns))
	for _, r := range returns {
		byKey[key{r.MessageId, r.Exchange, r.RoutingKey}] = nil
	}
	for _, s := range sent {
		k := key{msgs[s.i].MessageID, exchanges[s.i], msgs[s.i].RoutingKey}
		if idx, ok := byKey[k]; ok {
			byKey[k] = append(idx, s.i)
		}
	}
	n := 0
	for _, r := range returns {
		k := key{r.MessageId, r.Exchange, r.RoutingKey}
		idx := byKey[k]
		if len(idx) == 0 {
			p.log.Warn("return matches no message of the batch", "message_id", r.MessageId, "exchange", r.Exchange, "routing_key", r.RoutingKey)
			continue
		}
		byKey[k] = idx[1:]
		errs[idx[0]] = fmt.Errorf("%w: %d %s", ErrReturned, r.ReplyCode, r.ReplyText)
		n++
	}
	return n
}
