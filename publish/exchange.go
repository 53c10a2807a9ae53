package publish

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

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
		return fmt.Errorf("%w: check exchange %q: the connection was replaced", ErrNotConnected, name)
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
			return fmt.Errorf("%w: check exchange %q: the connection was replaced", ErrNotConnected, name)
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
		return checkError(name, err)
	}
	p.mu.Lock()
	p.known[name] = true
	p.mu.Unlock()
	return nil
}

// checkError is the error of a failed check of exchange name:
// ErrExchangeNotFound if the broker says it does not exist (404).
func checkError(name string, err error) error {
	var aerr *amqp.Error
	if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
		return fmt.Errorf("%w: %q", ErrExchangeNotFound, name)
	}
	return fmt.Errorf("publish: check exchange %q: %w", name, err)
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
