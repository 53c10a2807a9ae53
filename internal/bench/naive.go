package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/outboxrelay/outboxrelay/internal/redact"
	amqp "github.com/rabbitmq/amqp091-go"
)

// NaiveConfig configures RunNaive. Every field documents its default.
type NaiveConfig struct {
	// DatabaseURL reaches the database whose search_path holds the outbox
	// table; an application_name given in it is kept. Required.
	DatabaseURL string
	// AMQPURL is the RabbitMQ broker. Default "amqp://localhost:5672/".
	AMQPURL string
	// Exchange receives every event; it must exist. Default "outbox".
	Exchange string
	// Interval is the time between polls. Default 1s.
	Interval time.Duration
	// Limit is the most rows one poll takes. Default 50.
	Limit int
	// Logger receives failed events. Default: discarded.
	Logger *slog.Logger
}

func (c NaiveConfig) withDefaults() NaiveConfig {
	c.AMQPURL = cmp.Or(c.AMQPURL, "amqp://localhost:5672/")
	c.Exchange = cmp.Or(c.Exchange, "outbox")
	c.Interval = cmp.Or(c.Interval, time.Second)
	c.Limit = cmp.Or(c.Limit, 50)
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

// Validate reports the first setting that cannot work, naming it.
func (c NaiveConfig) Validate() error {
	c = c.withDefaults()
	switch {
	case c.DatabaseURL == "":
		return errors.New("naive: DatabaseURL: required")
	case c.Interval <= 0:
		return fmt.Errorf("naive: Interval %s: must be positive", c.Interval)
	case c.Limit < 1:
		return fmt.Errorf("naive: Limit %d: must be at least 1", c.Limit)
	}
	return nil
}

// RunNaive is the baseline: the naive poller of the classic outbox article.
// At start and then every Interval (a tick missed while a page is still
// being worked through is skipped) it selects up to Limit pending rows in id order, then one
// row at a time publishes it (as the relay would map it) on a confirm
// channel, waits for that message's confirm, and marks the row published.
// A nacked event is logged and left pending, as the article's catch does.
// It returns nil when ctx ends, even during its start.
func RunNaive(ctx context.Context, cfg NaiveConfig) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg = cfg.withDefaults()
	pgCfg, err := pgx.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("naive: database URL %s: %w", redact.URL(cfg.DatabaseURL), redact.Error(err, cfg.DatabaseURL))
	}
	if _, ok := pgCfg.RuntimeParams["application_name"]; !ok {
		pgCfg.RuntimeParams["application_name"] = "outboxrelay-naive"
	}
	connectCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	db, err := pgx.ConnectConfig(connectCtx, pgCfg)
	cancel()
	switch {
	case err != nil && ctx.Err() != nil:
		return nil // stopped while connecting, on a busy machine
	case err != nil:
		return fmt.Errorf("naive: PostgreSQL at %s: %w", redact.URL(cfg.DatabaseURL), redact.Error(err, cfg.DatabaseURL))
	}
	defer db.Close(context.WithoutCancel(ctx))
	broker, err := dialAMQP(cfg.AMQPURL, "outboxrelay-naive")
	switch {
	case err != nil && ctx.Err() != nil:
		return nil
	case err != nil:
		return fmt.Errorf("naive: %w", err)
	}
	defer broker.Close()
	ch, err := broker.Channel()
	if err != nil {
		return fmt.Errorf("naive: open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("naive: confirm mode: %w", err)
	}
	n := naive{cfg: cfg, db: db, ch: ch}
	ticker := time.NewTicker(cfg.Interval)
	defer ticker.Stop()
	for {
		if err := n.poll(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

type naive struct {
	cfg NaiveConfig
	db  *pgx.Conn
	ch  *amqp.Channel
}

type naiveRow struct {
	id                                    int64
	eventID, aggType, aggID, typ, payload string
	createdAt                             time.Time
}

// poll is one tick: select a page of pending rows, then publish and mark
// them one by one.
func (n naive) poll(ctx context.Context) error {
	selectCtx, cancel := context.WithTimeout(ctx, queryTimeout)
	rows, err := n.db.Query(selectCtx, `SELECT id, event_id::text, aggregate_type, aggregate_id, event_type, payload::text, created_at
		FROM outbox WHERE status = 'pending' ORDER BY id LIMIT $1`, n.cfg.Limit)
	var page []naiveRow
	if err == nil {
		page, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (naiveRow, error) {
			var e naiveRow
			err := r.Scan(&e.id, &e.eventID, &e.aggType, &e.aggID, &e.typ, &e.payload, &e.createdAt)
			return e, err
		})
	}
	cancel()
	if err != nil {
		return fmt.Errorf("naive: select pending: %w", err)
	}
	for _, e := range page {
		acked, err := n.publish(ctx, e)
		if err != nil {
			return err
		}
		if !acked {
			n.cfg.Logger.Error("naive: event nacked", "id", e.id)
			continue
		}
		updateCtx, cancel := context.WithTimeout(ctx, queryTimeout)
		_, err = n.db.Exec(updateCtx, `UPDATE outbox SET status = 'published', published_at = now() WHERE id = $1`, e.id)
		cancel()
		if err != nil {
			return fmt.Errorf("naive: mark %d published: %w", e.id, err)
		}
	}
	return nil
}

// publish sends one event and waits for its confirm.
func (n naive) publish(ctx context.Context, e naiveRow) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, confirmTimeout)
	defer cancel()
	dc, err := n.ch.PublishWithDeferredConfirmWithContext(ctx, n.cfg.Exchange, e.aggType+"."+e.typ, true, false, amqp.Publishing{
		Headers:      amqp.Table{"aggregate_type": e.aggType, "aggregate_id": e.aggID},
		ContentType:  "application/json",
		DeliveryMode: amqp.Persistent,
		MessageId:    e.eventID,
		Timestamp:    e.createdAt,
		Type:         e.typ,
		Body:         []byte(e.payload),
	})
	if err != nil {
		return false, fmt.Errorf("naive: publish %d: %w", e.id, err)
	}
	acked, err := dc.WaitContext(ctx)
	if err != nil {
		return false, fmt.Errorf("naive: confirm of %d: %w", e.id, err)
	}
	return acked, nil
}
