package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ceilingWindow is how many of the ceiling's publishes may await their
// confirm at once.
const ceilingWindow = 4096

// confirmTimeout bounds the wait for one publisher confirm.
const confirmTimeout = 30 * time.Second

// publishCeiling is the broker ceiling: no database, the events of rec
// published from memory as the relay would publish them (same exchange,
// routing key, properties and body size; persistent and mandatory) on one
// confirm channel with up to ceilingWindow confirms outstanding. It returns
// the clock reading of the first publish, once every message is confirmed.
func publishCeiling(ctx context.Context, amqpURL, exchange string, rec *record, p payloads, clk clock) (int64, error) {
	conn, ch, err := ceilingChannel(amqpURL)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	msgs := make([]amqp.Publishing, rec.size())
	created := time.Now()
	for i := range msgs {
		msgs[i] = ceilingMessage(rec.number(i), p, created)
	}
	window := make([]*amqp.DeferredConfirmation, ceilingWindow)
	start := clk.now()
	rec.commitAll(start)
	for i := range msgs {
		slot := i % len(window)
		if err := awaitConfirm(ctx, window[slot]); err != nil {
			return 0, fmt.Errorf("ceiling: message %d: %w", i-len(window), err)
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, routingKey, true, false, msgs[i])
		if err != nil {
			return 0, fmt.Errorf("ceiling: publish: %w", err)
		}
		window[slot] = dc
	}
	for _, dc := range window {
		if err := awaitConfirm(ctx, dc); err != nil {
			return 0, fmt.Errorf("ceiling: %w", err)
		}
	}
	return start, nil
}

// publishScheduled is the broker ceiling's paced path, the producers'
// schedule without a database: k publishers, each on a confirm channel of
// its own, publish slot i of rec from memory at start + due(i), publisher
// w the slots w, w+k, …, each confirmed before its next, as a producer's
// commit returns before its next insert. A publisher that falls behind
// publishes its next at once. An event counts as committed as its publish
// starts. It returns the clock reading of the schedule's start.
func publishScheduled(ctx context.Context, amqpURL, exchange string, k int, rec *record, p payloads, clk clock, due func(i int) time.Duration) (int64, error) {
	conn, err := dialAMQP(amqpURL, "outboxrelay-bench-ceiling")
	if err != nil {
		return 0, fmt.Errorf("ceiling: %w", err)
	}
	defer conn.Close()
	chans := make([]*amqp.Channel, k)
	for w := range chans {
		if chans[w], err = confirmChannel(conn); err != nil {
			return 0, err
		}
	}
	began, start := clk.now(), time.Now()
	return began, onSchedule(ctx, k, rec.size(), start, due, nil, func(ctx context.Context, w, i int) error {
		msg := ceilingMessage(rec.number(i), p, time.Now())
		rec.commit(i, clk.now())
		dc, err := chans[w].PublishWithDeferredConfirmWithContext(ctx, exchange, routingKey, true, false, msg)
		if err != nil {
			return fmt.Errorf("ceiling: publish: %w", err)
		}
		if err := awaitConfirm(ctx, dc); err != nil {
			return fmt.Errorf("ceiling: message %d: %w", i, err)
		}
		return nil
	})
}

// ceilingChannel is a connection and a confirm channel on it.
func ceilingChannel(amqpURL string) (*amqp.Connection, *amqp.Channel, error) {
	conn, err := dialAMQP(amqpURL, "outboxrelay-bench-ceiling")
	if err != nil {
		return nil, nil, fmt.Errorf("ceiling: %w", err)
	}
	ch, err := confirmChannel(conn)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, ch, nil
}

// confirmChannel opens a channel on conn in confirm mode.
func confirmChannel(conn *amqp.Connection) (*amqp.Channel, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("ceiling: open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("ceiling: confirm mode: %w", err)
	}
	return ch, nil
}

// ceilingMessage is event n as the relay would publish it: same
// properties and body size, persistent.
func ceilingMessage(n int64, p payloads, created time.Time) amqp.Publishing {
	return amqp.Publishing{
		Headers:      amqp.Table{"aggregate_type": aggregateType, "aggregate_id": strconv.FormatInt(n, 10)},
		ContentType:  "application/json",
		DeliveryMode: amqp.Persistent,
		MessageId:    eventID(n),
		Timestamp:    created,
		Type:         eventType,
		Body:         []byte(p.of(n)),
	}
}

// awaitConfirm waits for dc's confirm (nil: nothing to wait for).
func awaitConfirm(ctx context.Context, dc *amqp.DeferredConfirmation) error {
	if dc == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, confirmTimeout)
	defer cancel()
	acked, err := dc.WaitContext(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("await confirm: %w", err)
	case !acked:
		return errors.New("nacked by broker")
	}
	return nil
}
