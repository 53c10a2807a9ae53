package publish

import (
	"cmp"
	"context"
	"fmt"
	"sync/atomic"
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
// It is renewed while the batch makes progress: when it passes and a
// message of the batch was sent or confirmed since it was set, it is set
// again, ConfirmTimeout ahead. A broker that confirms slowly but steadily
// (a slow link, a loaded broker) is waited for, instead of having the
// batch failed and published again, which only loads it more; a
// connection that stopped answering fails the batch one to two
// ConfirmTimeouts after its last confirmation. While the broker blocks
// the connection (a resource alarm) the deadline stands still: the broker
// has stopped reading on purpose, and the batch waits for its
// confirmations instead of failing and being published twice. It restarts
// in full once the connection is unblocked. ctx ends the wait at any time.
//
// A message fails on its own with ErrInvalid (among others when its headers
// do not fit in one frame of the connection's frame size),
// ErrExchangeNotFound, ErrReturned or ErrNacked; the others of the batch are unaffected. If the
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
	// Checked here, with the trace context in the headers, against the
	// frame size this connection negotiated.
	todo = checkHeaderFrames(msgs, todo, errs, conn.Config.FrameSize)
	if len(todo) == 0 {
		return errs
	}
	// One deadline for the whole batch: checks, channel, sending, confirms.
	ctx, deadline, cancel := p.batchContext(ctx, gen)
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
	reusable := p.send(ctx, deadline, c, wire, msgs, exchanges, todo, errs)
	p.release(c, reusable)
	return errs
}

// checkHeaderFrames fails the messages whose content header frame would be
// larger than frameSize, and returns the rest of todo.
func checkHeaderFrames(msgs []Message, todo []int, errs []error, frameSize int) []int {
	kept := todo[:0]
	for _, i := range todo {
		pub := msgs[i].publishing()
		if err := checkHeaderFrame(&pub, frameSize); err != nil {
			errs[i] = err
			continue
		}
		kept = append(kept, i)
	}
	return kept
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
// only while the broker does not block connection gen, and renewed while
// the batch makes progress (batchDeadline.progressed). A blocked
// connection has stopped reading on purpose (a resource alarm); the
// batch's confirmations come once the alarm clears, and giving up on them
// would only publish the batch twice. The deadline starts afresh when the
// broker unblocks the connection; a connection lost while blocked fails
// the batch through its closed channel, and the caller's ctx still ends it
// at any time. A batch costs one timer at a time: the publisher stops and
// restarts it at each change of its state, and arms it again when it
// passes after progress (see batchDeadline).
func (p *Publisher) batchContext(ctx context.Context, gen uint64) (context.Context, *batchDeadline, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	d := &batchDeadline{gen: gen, cancel: cancel}
	p.mu.Lock()
	p.deadlines[d] = struct{}{}
	p.updateDeadlineLocked(d)
	p.mu.Unlock()
	return ctx, d, func() {
		p.mu.Lock()
		delete(p.deadlines, d)
		if d.stop != nil {
			d.stop()
		}
		p.mu.Unlock()
		cancel(context.Canceled)
	}
}

// batchDeadline is the deadline of one batch in flight on connection gen.
type batchDeadline struct {
	gen      uint64
	cancel   context.CancelCauseFunc
	progress atomic.Uint64 // messages of the batch sent or confirmed
	// Guarded by the publisher's mu:
	stop  func() bool // stops the armed timer; nil while blocked
	armed uint64      // progress when the timer was armed
}

// progressed records that a message of the batch was sent or confirmed.
func (d *batchDeadline) progressed() { d.progress.Add(1) }

// updateDeadlineLocked stops d's timer while the broker blocks d's
// connection and arms it afresh once it no longer does. p.mu must be held.
func (p *Publisher) updateDeadlineLocked(d *batchDeadline) {
	blocked := p.isBlock && p.conn != nil && p.gen == d.gen
	switch {
	case blocked && d.stop != nil:
		d.stop()
		d.stop = nil
	case !blocked && d.stop == nil:
		p.armLocked(d)
	}
}

// armLocked sets d's timer ConfirmTimeout ahead. p.mu must be held.
func (p *Publisher) armLocked(d *batchDeadline) {
	d.armed = d.progress.Load()
	d.stop = p.cfg.Clock.AfterFunc(p.cfg.ConfirmTimeout, func() { p.expired(d) })
}

// expired is d's timer passing. The batch fails with the confirm timeout
// unless it made progress since the timer was armed: then the timer is
// armed again. A batch already done, or waiting on a blocked connection
// (whose unblocking arms the timer afresh), is left alone.
func (p *Publisher) expired(d *batchDeadline) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, live := p.deadlines[d]; !live || d.stop == nil {
		return
	}
	if d.progress.Load() != d.armed {
		p.armLocked(d)
		return
	}
	d.cancel(p.timeout)
}

// pending is one sent message and its confirmation.
type pending struct {
	i  int
	dc *amqp.DeferredConfirmation
}

// send publishes msgs[todo] on c, awaits their confirmations until ctx
// (the batch deadline, renewed through deadline by every message sent or
// confirmed) ends, and fills errs. It reports whether c may take
// another batch: no confirmation may still be outstanding on it, or a late
// one could be taken for the next batch's.
func (p *Publisher) send(ctx context.Context, deadline *batchDeadline, c *channel, wire *coalescingConn, msgs []Message, exchanges []string, todo []int, errs []error) bool {
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
		dc, err := c.ch.PublishWithDeferredConfirmWithContext(ctx, exchanges[i], m.RoutingKey, true, false, m.publishing())
		if err != nil {
			if ctx.Err() != nil {
				err = context.Cause(ctx)
			}
			sendErr = fmt.Errorf("publish: send: %w", err)
			fail(errs, todo[k:], sendErr)
			break
		}
		sent = append(sent, pending{i: i, dc: dc})
		deadline.progressed()
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
			deadline.progressed()
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
