package inbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Handler applies one delivery's effects inside tx. Returning an error (or
// panicking) rolls tx back: the message id is not recorded and the delivery
// is tried again, up to Config.MaxAttempts. The handler must not commit or
// roll back tx, nor ack, reject or nack d: the consumer does.
//
// tx is the inbox's own pgx.Tx, begun in the round trip that records the
// message. It works as pgx's does (tx.Begin makes a savepoint), except
// LargeObjects, which panics with ErrLargeObjects. Once the handler
// returned, tx refuses every call with pgx.ErrTxClosed.
type Handler func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error

// Execer runs DDL: *pgxpool.Pool, *pgx.Conn, pgx.Tx satisfy it.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Config configures a Consumer. AMQPURL, Queue, Name, DB and Handler are
// required; every other field has the default its comment states.
type Config struct {
	// AMQPURL is the broker's URL, amqp://user:password@host:port/vhost.
	// Required; never logged with its password.
	AMQPURL string
	// Queue is the queue to consume. Required. The consumer does not
	// declare it; it must have a dead-letter exchange (x-dead-letter-exchange
	// argument or policy), where rejected deliveries go.
	Queue string
	// Name is the consumer's name, the first column of the inbox's key: two
	// services that must each see every message have different names; the
	// copies of one service share one. Required.
	Name string
	// DB is the pool of the handlers' transactions, of the counts of failed
	// attempts and of the cleanup; with at least Prefetch + 1 connections
	// no handler waits for one. Required.
	DB *pgxpool.Pool
	// Handler applies a delivery's effects. Required.
	Handler Handler
	// Table is the inbox table; default "inbox". It may be schema-qualified
	// ("billing.inbox"); names are quoted as given.
	Table string
	// IDHeader picks the message's key: "" (the default) is the AMQP
	// message-id property, which the relay sets; otherwise the header of
	// that name, whose value must be a string.
	IDHeader string
	// Prefetch is the channel's prefetch count, and as many handlers run
	// concurrently; default 32.
	Prefetch int
	// MaxAttempts is how many times a message's handler may fail before
	// the delivery is rejected to the dead-letter exchange; default 5.
	MaxAttempts int
	// RetryMin is the delay before the first retry; each retry doubles it,
	// jittered, up to RetryMax. Default 100ms.
	RetryMin time.Duration
	// RetryMax caps the delay between retries; default 10s.
	RetryMax time.Duration
	// Retention is the dedupe window: records older than this are deleted,
	// and a duplicate that arrives later is processed again. Default 7 days.
	Retention time.Duration
	// CleanupInterval is how often this consumer deletes records older than
	// Retention; default 1m; a negative value disables cleanup here (run it
	// elsewhere, or in one copy only).
	CleanupInterval time.Duration
	// CleanupBatch is how many rows one cleanup statement deletes at most;
	// default 1000.
	CleanupBatch int
	// ShutdownTimeout bounds how long Run waits, once its context is
	// cancelled, for handlers in flight; then their contexts are cancelled,
	// their transactions rolled back and their deliveries left unacked (the
	// broker redelivers them). Default 30s.
	ShutdownTimeout time.Duration
	// Registerer registers the consumer's metrics; default nil: no metrics.
	Registerer prometheus.Registerer
	// Logger logs with a component=inbox attribute; default: discards.
	Logger *slog.Logger
}

// Defaults.
const (
	DefaultTable           = "inbox"
	DefaultPrefetch        = 32
	DefaultMaxAttempts     = 5
	DefaultRetryMin        = 100 * time.Millisecond
	DefaultRetryMax        = 10 * time.Second
	DefaultRetention       = 7 * 24 * time.Hour
	DefaultCleanupInterval = time.Minute
	DefaultCleanupBatch    = 1000
	DefaultShutdownTimeout = 30 * time.Second
)

// Consumer consumes one queue and runs Config.Handler once per message id.
// Make one with New, then call Run.
type Consumer struct {
	cfg     Config
	log     *slog.Logger
	broker  string // AMQPURL without its credentials, for logs
	table   pgx.Identifier
	sql     statements
	metrics *metrics
}

// New fills cfg's defaults, validates it and returns a Consumer. Errors
// name the field: "inbox: Config.Queue is required".
func New(cfg Config) (*Consumer, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	table, err := tableIdentifier(cfg.Table)
	if err != nil {
		return nil, fmt.Errorf("inbox: Config.Table: %w", err)
	}
	m, err := newMetrics(cfg.Registerer, cfg.Name)
	if err != nil {
		return nil, err
	}
	return &Consumer{
		cfg:     cfg,
		broker:  redactURL(cfg.AMQPURL),
		log:     cfg.Logger.With("component", "inbox", "consumer", cfg.Name, "queue", cfg.Queue),
		table:   table,
		sql:     newStatements(table),
		metrics: m,
	}, nil
}

func (cfg Config) withDefaults() (Config, error) {
	switch {
	case cfg.AMQPURL == "":
		return cfg, errors.New("inbox: Config.AMQPURL is required")
	case cfg.Queue == "":
		return cfg, errors.New("inbox: Config.Queue is required")
	case cfg.Name == "":
		return cfg, errors.New("inbox: Config.Name is required")
	case cfg.DB == nil:
		return cfg, errors.New("inbox: Config.DB is required")
	case cfg.Handler == nil:
		return cfg, errors.New("inbox: Config.Handler is required")
	}
	if _, err := amqp.ParseURI(cfg.AMQPURL); err != nil {
		// ParseURI's errors do not repeat the URL, so no password leaks.
		return cfg, fmt.Errorf("inbox: Config.AMQPURL: %w", err)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"Prefetch", int64(cfg.Prefetch)},
		{"MaxAttempts", int64(cfg.MaxAttempts)},
		{"RetryMin", int64(cfg.RetryMin)},
		{"RetryMax", int64(cfg.RetryMax)},
		{"Retention", int64(cfg.Retention)},
		{"CleanupBatch", int64(cfg.CleanupBatch)},
		{"ShutdownTimeout", int64(cfg.ShutdownTimeout)},
	} {
		if f.v < 0 {
			return cfg, fmt.Errorf("inbox: Config.%s must not be negative", f.name)
		}
	}
	cfg.Table = cmp.Or(cfg.Table, DefaultTable)
	cfg.Prefetch = cmp.Or(cfg.Prefetch, DefaultPrefetch)
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, DefaultMaxAttempts)
	cfg.RetryMin = cmp.Or(cfg.RetryMin, DefaultRetryMin)
	cfg.RetryMax = cmp.Or(cfg.RetryMax, DefaultRetryMax)
	cfg.Retention = cmp.Or(cfg.Retention, DefaultRetention)
	cfg.CleanupInterval = cmp.Or(cfg.CleanupInterval, DefaultCleanupInterval)
	cfg.CleanupBatch = cmp.Or(cfg.CleanupBatch, DefaultCleanupBatch)
	cfg.ShutdownTimeout = cmp.Or(cfg.ShutdownTimeout, DefaultShutdownTimeout)
	if cfg.RetryMax < cfg.RetryMin {
		return cfg, fmt.Errorf("inbox: Config.RetryMax (%v) is less than Config.RetryMin (%v)", cfg.RetryMax, cfg.RetryMin)
	}
	if cfg.Prefetch > 65535 {
		return cfg, fmt.Errorf("inbox: Config.Prefetch %d is more than AMQP's 65535", cfg.Prefetch)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return cfg, nil
}

// redactURL returns an AMQP URL's scheme, host, port and vhost: no
// credentials.
func redactURL(raw string) string {
	u, err := amqp.ParseURI(raw)
	if err != nil {
		return "(invalid URL)"
	}
	return fmt.Sprintf("%s://%s:%d/%s", u.Scheme, u.Host, u.Port, url.PathEscape(u.Vhost))
}

// tableIdentifier splits name on "." into schema and table.
func tableIdentifier(name string) (pgx.Identifier, error) {
	id := pgx.Identifier(strings.Split(cmp.Or(name, DefaultTable), "."))
	if len(id) > 2 {
		return nil, fmt.Errorf("%q: want table or schema.table", name)
	}
	for _, part := range id {
		if part == "" || strings.ContainsRune(part, 0) {
			return nil, fmt.Errorf("%q: want table or schema.table", name)
		}
	}
	return id, nil
}
