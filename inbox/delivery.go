package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	amqp "github.com/rabbitmq/amqp091-go"
)

// outcome is how one attempt at a delivery ended.
type outcome int

const (
	// processed: the handler's transaction committed; ack.
	processed outcome = iota
	// duplicate: the message was processed already; ack, handler not run.
	duplicate
	// exhausted: the message failed MaxAttempts times; reject to the
	// dead-letter exchange.
	exhausted
	// failed: the handler failed (error or panic), the attempt is
	// counted; retry after a backoff.
	failed
	// fault: the database failed, not the handler (a begin, the insert or
	// the commit; a connection lost): nothing counted, nothing acked;
	// retry after a backoff. A failed commit may have committed: the next
	// attempt finds out (a duplicate).
	fault
	// aborted: the shutdown timeout cancelled the attempt; its transaction
	// rolled back; the delivery goes back to the queue.
	aborted
)

// PanicError is the error a handler's panic becomes: the attempt fails as
// if the handler had returned it.
type PanicError struct {
	Value any    // what the handler panicked with
	Stack []byte // the panicking goroutine's stack
}

func (e *PanicError) Error() string { return fmt.Sprintf("inbox: handler panicked: %v", e.Value) }

// deliver runs d to its end: acked once processed (or a duplicate),
// rejected to the dead-letter exchange when it has no id or failed
// MaxAttempts times, and otherwise retried in process, after a jittered
// backoff, while ctx lasts and its channel is open. When ctx ends during a
// backoff, the delivery goes back to the queue; when its channel closed,
// the broker has requeued it already.
func (c *Consumer) deliver(ctx, hctx context.Context, d amqp.Delivery) {
	id := c.messageID(d)
	log := deliveryLog{c.log, id, d.DeliveryTag, d.Redelivered}
	if id == "" {
		if err := d.Reject(false); err != nil {
			log.Warn("reject a delivery without a message id failed; the broker redelivers it", "error", err)
			return
		}
		c.metrics.incDeadMissing()
		log.Error("delivery without a message id rejected to the dead-letter exchange", "id_header", c.cfg.IDHeader)
		return
	}
	faults := 0
	for {
		result, attempts, err := c.attempt(hctx, id, d, log)
		var delay time.Duration
		switch result {
		case processed:
			c.metrics.incProcessed()
			c.ack(d, log)
			log.Debug("processed")
			return
		case duplicate:
			c.metrics.incDuplicates()
			c.ack(d, log)
			log.Debug("duplicate acked without running the handler")
			return
		case exhausted:
			c.deadLetter(hctx, id, d, attempts, log)
			return
		case aborted:
			log.Warn("handler cancelled by the shutdown timeout; its transaction rolled back", "error", err)
			c.nack(d)
			return
		case failed:
			c.metrics.incRetried()
			delay = c.retryDelay(attempts)
			log.Warn("handler failed; retrying", "error", err, "attempts", attempts, "max_attempts", c.cfg.MaxAttempts, "retry_in", delay)
		case fault:
			faults++
			c.metrics.incDatabaseFailures()
			delay = c.retryDelay(faults)
			log.Warn("database failed; retrying (not counted as an attempt)", "error", err, "retry_in", delay)
		}
		if !sleep(ctx, delay) {
			c.nack(d)
			return
		}
		if channelClosed(d) {
			log.Debug("channel closed during the backoff; the broker redelivers the message")
			return
		}
	}
}

// attempt runs the handler once for d in a new transaction, preceded by
// the insert that records the message (or finds it processed), and
// commits; when the handler failed, it counts the attempt. attempts is the
// number of failed attempts so far, for failed and exhausted.
func (c *Consumer) attempt(hctx context.Context, id string, d amqp.Delivery, log deliveryLog) (_ outcome, attempts int, _ error) {
	result, attempts, herr := c.transact(hctx, id, d, log)
	if result != failed {
		return result, attempts, herr
	}
	// Counted on another connection, once the handler's transaction rolled
	// back and released the row lock this statement would wait for.
	attempts, err := c.recordFailure(hctx, id, herr)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return duplicate, 0, nil // a concurrent copy processed it meanwhile
	case err != nil:
		return faultOrAborted(hctx, fmt.Errorf("inbox: count failed attempt: %w (after the handler's error: %w)", err, herr))
	case attempts >= c.cfg.MaxAttempts:
		return exhausted, attempts, herr
	}
	return failed, attempts, herr
}

// faultOrAborted is the outcome of a database failure: aborted once the
// shutdown timeout cancelled hctx, else fault.
func faultOrAborted(hctx context.Context, err error) (outcome, int, error) {
	if hctx.Err() != nil {
		return aborted, 0, err
	}
	return fault, 0, err
}

// transact runs the handler for d in a transaction on a connection of its
// own, begun with the record, and commits; it gives the connection back
// before it returns. failed means the handler failed (its error, a panic,
// or a commit the server refused): the transaction rolled back and the
// attempt is still to be counted.
func (c *Consumer) transact(hctx context.Context, id string, d amqp.Delivery, log deliveryLog) (_ outcome, attempts int, _ error) {
	actx, cancel := context.WithTimeout(hctx, opTimeout)
	conn, err := c.cfg.DB.Acquire(actx)
	cancel()
	if err != nil {
		return faultOrAborted(hctx, fmt.Errorf("inbox: acquire a connection: %w", err))
	}
	defer conn.Release()
	// The hot path: BEGIN and the record in one round trip. The record's
	// row lock is held to the end of tx.
	tx, attempts, err := begin(hctx, conn.Conn(), c.sql.mark, c.cfg.Name, id)
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(hctx), opTimeout)
		defer cancel()
		if err := tx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
			log.Debug("rollback", "error", err)
		}
	}()
	if err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return duplicate, 0, nil
		}
		return faultOrAborted(hctx, fmt.Errorf("inbox: begin and record message: %w", err))
	}
	if attempts >= c.cfg.MaxAttempts {
		// Counted out before (and not rejected then: a crash, a cut).
		return exhausted, attempts, nil
	}

	start := time.Now()
	herr := c.call(hctx, tx, d)
	c.metrics.observe(time.Since(start).Seconds())
	if herr == nil {
		cctx, cancel := context.WithTimeout(hctx, opTimeout)
		herr = tx.Commit(cctx)
		cancel()
		if herr == nil {
			return processed, 0, nil
		}
		if !commitRefused(herr) {
			// The commit may or may not have happened: no ack; the next
			// attempt's insert tells.
			return faultOrAborted(hctx, fmt.Errorf("inbox: commit: %w", herr))
		}
		// The server refused the commit (a deferred constraint), or the
		// handler left tx failed (it swallowed a statement's error) or
		// ended it: the handler's fault.
		herr = fmt.Errorf("inbox: commit: %w", herr)
	}
	if hctx.Err() != nil {
		return aborted, 0, herr
	}
	var panicked *PanicError
	if errors.As(herr, &panicked) {
		log.Error("handler panicked", "panic", fmt.Sprint(panicked.Value), "stack", string(panicked.Stack))
	}
	if connectionLost(herr, tx) {
		return fault, 0, herr
	}
	return failed, 0, herr
}

// call runs the handler, turning a panic into a *PanicError.
func (c *Consumer) call(ctx context.Context, tx pgx.Tx, d amqp.Delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return c.cfg.Handler(ctx, tx, d)
}

// commitRefused tells a commit error after which the transaction surely
// did not commit, through the handler's doing: the server answered the
// COMMIT with an error (not one that ends the connection), or pgx knew the
// transaction had failed or ended. Any other error leaves the outcome
// unknown.
func commitRefused(err error) bool {
	if errors.Is(err, pgx.ErrTxCommitRollback) || errors.Is(err, pgx.ErrTxClosed) {
		return true
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && !connectionClass(pgErr.Code)
}

// connectionClass tells the SQLSTATE classes of a connection that fails
// or that the server ends: 08 (connection exception) and 57P (operator
// intervention: pg_terminate_backend, shutdown).
func connectionClass(code string) bool {
	return strings.HasPrefix(code, "08") || strings.HasPrefix(code, "57P")
}

// connectionLost tells a handler error that is the database's doing, not
// the handler's: the connection is gone (closed, or the server ends it:
// SQLSTATE classes 08 and 57P, e.g. pg_terminate_backend).
func connectionLost(err error, tx pgx.Tx) bool {
	if conn := tx.Conn(); conn != nil && conn.IsClosed() {
		return true
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && connectionClass(pgErr.Code)
}

// maxErrorLen bounds the handler error kept in last_error.
const maxErrorLen = 1000

// recordFailure counts a failed attempt and returns the attempts so far,
// or pgx.ErrNoRows when the message was processed meanwhile.
func (c *Consumer) recordFailure(hctx context.Context, id string, herr error) (int, error) {
	msg := strings.ToValidUTF8(strings.ReplaceAll(herr.Error(), "\x00", ""), "?")
	if len(msg) > maxErrorLen {
		msg = strings.ToValidUTF8(msg[:maxErrorLen], "")
	}
	ctx, cancel := context.WithTimeout(hctx, opTimeout)
	defer cancel()
	var attempts int
	err := c.queryRow(ctx, c.sql.fail, []any{c.cfg.Name, id, msg}, &attempts)
	return attempts, err
}

// deadLetter rejects d to the dead-letter exchange, then gives the message
// fresh attempts, so that a copy moved back from the dead-letter queue is
// tried again.
func (c *Consumer) deadLetter(hctx context.Context, id string, d amqp.Delivery, attempts int, log deliveryLog) {
	if err := d.Reject(false); err != nil {
		log.Warn("reject failed; the broker redelivers the message and it is rejected then", "error", err)
		return
	}
	c.metrics.incDeadAttempts()
	log.Error("message rejected to the dead-letter exchange after failed attempts", "attempts", attempts)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(hctx), opTimeout)
	defer cancel()
	if _, err := c.exec(ctx, c.sql.reset, c.cfg.Name, id); err != nil {
		log.Warn("reset the attempts of a dead-lettered message", "error", err)
	}
}

// messageID is d's key: its message-id property, or the IDHeader header's
// string value.
func (c *Consumer) messageID(d amqp.Delivery) string {
	if c.cfg.IDHeader == "" {
		return d.MessageId
	}
	id, _ := d.Headers[c.cfg.IDHeader].(string)
	return id
}

func (c *Consumer) ack(d amqp.Delivery, log deliveryLog) {
	if err := d.Ack(false); err != nil {
		// One per delivery in flight when a connection is cut; the
		// reconnect is logged as a warning once.
		log.Debug("ack failed; the broker redelivers the message, which is acked then as a duplicate", "error", err)
	}
}

// nack returns d to the queue.
func (c *Consumer) nack(d amqp.Delivery) {
	if err := d.Nack(false, true); err != nil {
		c.log.Debug("nack failed; the broker requeues the message when the channel closes", "error", err, "delivery_tag", d.DeliveryTag)
	}
}

// channelClosed tells whether d's channel is closed.
func channelClosed(d amqp.Delivery) bool {
	ch, ok := d.Acknowledger.(interface{ IsClosed() bool })
	return ok && ch.IsClosed()
}

// retryDelay is the backoff before retry n (1, 2, ...): RetryMin doubled
// n-1 times, at most RetryMax, jittered down by up to a half.
func (c *Consumer) retryDelay(n int) time.Duration {
	d := c.cfg.RetryMin
	for i := 1; i < n && d < c.cfg.RetryMax; i++ {
		d *= 2
	}
	d = min(d, c.cfg.RetryMax)
	return d - rand.N(d/2+1)
}

// deliveryLog logs about one delivery. Its attributes are only formatted
// when a record is written: nothing is spent on the hot path when the level
// is off.
type deliveryLog struct {
	logger      *slog.Logger
	id          string
	tag         uint64
	redelivered bool
}

func (l deliveryLog) log(level slog.Level, msg string, args ...any) {
	ctx := context.Background()
	if !l.logger.Enabled(ctx, level) {
		return
	}
	l.logger.Log(ctx, level, msg, append([]any{"message_id", l.id, "delivery_tag", l.tag, "redelivered", l.redelivered}, args...)...)
}

func (l deliveryLog) Debug(msg string, args ...any) { l.log(slog.LevelDebug, msg, args...) }
func (l deliveryLog) Warn(msg string, args ...any)  { l.log(slog.LevelWarn, msg, args...) }
func (l deliveryLog) Error(msg string, args ...any) { l.log(slog.LevelError, msg, args...) }
