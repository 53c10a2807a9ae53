// Command inboxconsumer is the consumer the fault suite's inbox scenario
// (TestInboxLedgerUnderFaults) runs, three copies at once, and kills,
// cuts off and restarts: an inbox.Consumer whose handler counts every
// event in a ledger row, in the delivery's own transaction,
//
//	INSERT INTO ledger (event_id, n, redelivered) VALUES ($1, 1, $2)
//	ON CONFLICT (event_id) DO UPDATE SET n = ledger.n + 1
//
// so that an effect applied twice shows as n = 2. The ledger table is the
// scenario's; the program creates nothing.
//
// It is configured by the environment: DATABASE_URL (pool settings and
// application_name may be in it), AMQP_URL, QUEUE, NAME (the inbox's
// consumer name, shared by the copies), and METRICS_ADDR (default
// 127.0.0.1:0, a port of its own), where it serves its Prometheus metrics
// at /metrics. Once that listens, it logs, as a JSON line on stderr,
//
//	{"msg":"inbox consumer started","addr":"127.0.0.1:…",…}
//
// then runs until SIGTERM or SIGINT, and exits 0 after the consumer's
// graceful shutdown.
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/internal/redact"
)

// countSQL is the handler's one statement: the event's counter, which the
// scenario requires to end at exactly 1. redelivered notes whether the
// copy that applied the effect was one RabbitMQ redelivered (an earlier
// delivery of it never committed, or never got its ack through).
const countSQL = `INSERT INTO ledger (event_id, n, redelivered) VALUES ($1, 1, $2)
ON CONFLICT (event_id) DO UPDATE SET n = ledger.n + 1`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil)).With("pid", os.Getpid())
	err := run(ctx, log)
	stop()
	if err != nil {
		log.Error("inbox consumer failed", "error", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, log *slog.Logger) error {
	env := map[string]string{}
	for _, k := range []string{"DATABASE_URL", "AMQP_URL", "QUEUE", "NAME"} {
		if env[k] = os.Getenv(k); env[k] == "" {
			return fmt.Errorf("%s is required", k)
		}
	}
	databaseURL := env["DATABASE_URL"]
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", redact.Error(err, databaseURL))
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("pool: %w", redact.Error(err, databaseURL))
	}
	defer pool.Close()

	reg := prometheus.NewRegistry()
	consumer, err := inbox.New(inbox.Config{
		AMQPURL:    env["AMQP_URL"],
		Queue:      env["QUEUE"],
		Name:       env["NAME"],
		DB:         pool,
		Handler:    count,
		Registerer: reg,
		Logger:     log,
	})
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", cmp.Or(os.Getenv("METRICS_ADDR"), "127.0.0.1:0"))
	if err != nil {
		return fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("inbox consumer started", "addr", ln.Addr().String(), "queue", env["QUEUE"], "consumer", env["NAME"])

	err = consumer.Run(ctx)
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if serr := srv.Shutdown(shutdown); serr != nil {
		err = errors.Join(err, fmt.Errorf("metrics server shutdown: %w", serr))
	}
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, fmt.Errorf("metrics server: %w", serr))
	}
	if err == nil {
		log.Info("inbox consumer stopped")
	}
	return err
}

// count is the handler: one ledger increment per delivery it is given.
func count(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
	if _, err := tx.Exec(ctx, countSQL, d.MessageId, d.Redelivered); err != nil {
		return fmt.Errorf("count %s in the ledger: %w", d.MessageId, err)
	}
	return nil
}
