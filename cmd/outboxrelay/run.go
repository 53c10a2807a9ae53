package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/cli"
	"github.com/outboxrelay/outboxrelay/internal/health"
	"github.com/outboxrelay/outboxrelay/internal/redact"
	"github.com/outboxrelay/outboxrelay/internal/relay"
	"github.com/outboxrelay/outboxrelay/notify"
	"github.com/outboxrelay/outboxrelay/publish"
)

// RunCmd relays events. Every flag has an environment variable and a default
// that reaches PostgreSQL and RabbitMQ on their local default ports.
type RunCmd struct {
	DatabaseFlags
	AMQPURL string `name:"amqp-url" env:"AMQP_URL" default:"amqp://localhost:5672/" help:"RabbitMQ URL, amqp:// or amqps:// (no credentials means guest/guest), or several separated by commas (a cluster's nodes), tried in turn at every connect."`
	AMQPTLS
	cli.LogFlags
	SchemaFlags
	HTTPFlags

	ListenerURL string `name:"listener-url" env:"OUTBOX_LISTENER_URL" help:"PostgreSQL URL of a session of its own for LISTEN, the migrations and the metrics sampler: a direct connection or a session-mode pool (default: --database-url). Naming another URL than --database-url says that --database-url goes through a transaction-mode pool (PgBouncer): the relay then keeps no session state on it."`
	NoListen    bool   `name:"no-listen" env:"OUTBOX_NO_LISTEN" help:"Poll only, for setups with no session connection at all: no LISTEN, so events wait for the next poll (set --poll-interval to the latency you accept); --database-url is taken for a transaction-mode pool and the migrations must run separately (outboxrelay migrate on a direct URL)."`

	Migrate  bool          `name:"migrate" env:"OUTBOX_MIGRATE" default:"true" negatable:"" help:"Before relaying, apply the schema migrations, which create the table outbox, and install the trigger for --channel and the index --ordering needs; a table of your own (another --table, or other columns or statuses) needs --no-migrate, once outboxrelay migrate or sql has set it up."`
	Gate     bool          `name:"gate" env:"OUTBOX_GATE" default:"true" negatable:"" help:"Silence the trigger's NOTIFY while the relay is busy (--no-gate: producers notify while a relay listens)."`
	BusyRate float64       `name:"busy-rate" env:"OUTBOX_BUSY_RATE" default:"1000" help:"Inserts per second above which the relay closes the gate and polls every --busy-poll-interval; it reopens below half of it. Producers queued on the NOTIFY lock close it below this rate too."`
	BusyPoll time.Duration `name:"busy-poll-interval" env:"OUTBOX_BUSY_POLL_INTERVAL" default:"2ms" help:"How often a busy relay claims."`

	Exchange       string        `name:"exchange" env:"OUTBOX_EXCHANGE" default:"outbox" help:"Exchange for rows whose exchange column is NULL."`
	DeclareExch    bool          `name:"declare-exchange" env:"OUTBOX_DECLARE_EXCHANGE" default:"true" negatable:"" help:"Declare --exchange as a durable topic exchange at start-up."`
	ConfirmTimeout time.Duration `name:"confirm-timeout" env:"OUTBOX_CONFIRM_TIMEOUT" default:"15s" help:"Deadline for a batch's publisher confirms, renewed while they arrive: a batch fails after this long with none of it sent or confirmed."`
	MaxMessageSize int           `name:"max-message-size" env:"OUTBOX_MAX_MESSAGE_SIZE" default:"16777216" help:"Largest payload in bytes; larger events are dead-lettered."`
	MessageFormat  string        `name:"message-format" env:"OUTBOX_MESSAGE_FORMAT" default:"plain" enum:"plain,cloudevents,cloudevents-structured" help:"plain: the payload as the body, the row's fields as properties and headers; cloudevents: a CloudEvent in binary content mode (ce- headers, the payload as the body); cloudevents-structured: a CloudEvent as a JSON body (application/cloudevents+json)."`
	CESource       string        `name:"cloudevents-source" env:"OUTBOX_CLOUDEVENTS_SOURCE" default:"outboxrelay" help:"The CloudEvents source attribute of every event (a URI-reference naming the producing service, e.g. https://orders.example.com), with --message-format cloudevents."`

	BatchSize     int           `name:"batch-size" env:"OUTBOX_BATCH_SIZE" default:"500" help:"Most events one claim takes."`
	MaxBatchBytes int           `name:"max-batch-bytes" env:"OUTBOX_MAX_BATCH_BYTES" default:"16777216" help:"Most payload and header bytes one claim takes (at least one event); with --workers, bounds the memory of events in flight."`
	Workers       int           `name:"workers" env:"OUTBOX_WORKERS" default:"4" help:"Concurrent claim-publish loops."`
	MarkDelay     time.Duration `name:"mark-delay" env:"OUTBOX_MARK_DELAY" default:"20ms" help:"How long the marks of confirmed events may wait for the next claim, which then carries them in the same round trip and commit; 0 marks each batch at once."`
	Procs         int           `name:"procs" env:"OUTBOX_PROCS" default:"1" help:"How many OS threads run the relay's Go code at once (GOMAXPROCS); 0 leaves it to the Go runtime (GOMAXPROCS in the environment, or the CPUs available). One costs the least CPU per event: the relay mostly waits on the network, and every extra thread woken to run a goroutine is a wake-up across CPUs."`
	PollInterval  time.Duration `name:"poll-interval" env:"OUTBOX_POLL_INTERVAL" default:"5s" help:"Fallback poll for events whose notification was missed (jittered ±10%; from 2s up, on the nearest whole second)."`
	Lease         time.Duration `name:"lease" env:"OUTBOX_LEASE" default:"30s" help:"How long a claim holds its events before another relay may take them, unless the relay that made it dies first (then at once; with --no-listen, after this still); must exceed --confirm-timeout."`
	MaxAttempts   int           `name:"max-attempts" env:"OUTBOX_MAX_ATTEMPTS" default:"25" help:"Publish attempts before an event is dead-lettered (status failed)."`
	RetryMin      time.Duration `name:"retry-min" env:"OUTBOX_RETRY_MIN" default:"1s" help:"Delay after the first failed attempt; doubles per attempt, jittered ±25%."`
	RetryMax      time.Duration `name:"retry-max" env:"OUTBOX_RETRY_MAX" default:"5m" help:"Longest delay between attempts."`

	Retention       time.Duration `name:"retention" env:"OUTBOX_RETENTION" default:"24h" help:"How long published events are kept before cleanup deletes them; 0 keeps none: a confirmed event's row is deleted at once, in place of its mark."`
	CleanupInterval time.Duration `name:"cleanup-interval" env:"OUTBOX_CLEANUP_INTERVAL" default:"1m" help:"How often cleanup runs; 0 turns it off."`
	ShutdownTimeout time.Duration `name:"shutdown-timeout" env:"OUTBOX_SHUTDOWN_TIMEOUT" default:"20s" help:"How long in-flight batches may take to settle after SIGINT/SIGTERM."`
}

// configs checks every setting, naming the flag at fault, and builds the
// configurations of the parts.
func (c *RunCmd) configs() (claim.Config, publish.Config, relay.Config, error) {
	type check struct {
		bad  bool
		flag string
		msg  string
	}
	for _, ck := range []check{
		{c.BatchSize < 1, "--batch-size", fmt.Sprintf("%d: must be at least 1", c.BatchSize)},
		{c.MaxBatchBytes < 1, "--max-batch-bytes", fmt.Sprintf("%d: must be at least 1", c.MaxBatchBytes)},
		{c.Workers < 1, "--workers", fmt.Sprintf("%d: must be at least 1", c.Workers)},
		{c.MarkDelay < 0, "--mark-delay", fmt.Sprintf("%s: must not be negative", c.MarkDelay)},
		{c.Procs < 0, "--procs", fmt.Sprintf("%d: must not be negative", c.Procs)},
		{c.PollInterval <= 0, "--poll-interval", fmt.Sprintf("%s: must be positive", c.PollInterval)},
		{c.Lease <= 0, "--lease", fmt.Sprintf("%s: must be positive", c.Lease)},
		{c.ConfirmTimeout <= 0, "--confirm-timeout", fmt.Sprintf("%s: must be positive", c.ConfirmTimeout)},
		{c.Lease <= c.ConfirmTimeout, "--lease", fmt.Sprintf("%s: must exceed --confirm-timeout (%s) so a live relay keeps its claims", c.Lease, c.ConfirmTimeout)},
		{c.MaxAttempts < 1, "--max-attempts", fmt.Sprintf("%d: must be at least 1", c.MaxAttempts)},
		{c.RetryMin <= 0, "--retry-min", fmt.Sprintf("%s: must be positive", c.RetryMin)},
		{c.RetryMax < c.RetryMin, "--retry-max", fmt.Sprintf("%s: must be at least --retry-min (%s)", c.RetryMax, c.RetryMin)},
		{c.MaxMessageSize < 1, "--max-message-size", fmt.Sprintf("%d: must be at least 1", c.MaxMessageSize)},
		{c.Retention < 0, "--retention", fmt.Sprintf("%s: must not be negative", c.Retention)},
		{c.CleanupInterval < 0, "--cleanup-interval", fmt.Sprintf("%s: must not be negative", c.CleanupInterval)},
		{c.ShutdownTimeout <= 0, "--shutdown-timeout", fmt.Sprintf("%s: must be positive", c.ShutdownTimeout)},
		{c.Channel == "" || len(c.Channel) > 63, "--channel", fmt.Sprintf("%q: must be 1 to 63 bytes", c.Channel)},
		{c.BusyRate <= 0, "--busy-rate", fmt.Sprintf("%g: must be positive", c.BusyRate)},
		{c.BusyPoll <= 0, "--busy-poll-interval", fmt.Sprintf("%s: must be positive", c.BusyPoll)},
		{c.NoListen && c.ListenerURL != "", "--no-listen", "polls only, with no session connection: it takes no --listener-url"},
	} {
		if ck.bad {
			return claim.Config{}, publish.Config{}, relay.Config{}, cli.Usagef("%s %s", ck.flag, ck.msg)
		}
	}
	cc, err := c.claimConfig()
	if err != nil {
		return claim.Config{}, publish.Config{}, relay.Config{}, err
	}
	cc.Lease = c.Lease
	cc.MaxBatchBytes = c.MaxBatchBytes
	cc.MaxAttempts = c.MaxAttempts
	cc.RetryMin = c.RetryMin
	cc.RetryMax = c.RetryMax
	cc.Pooled = c.pooled()
	cc.DeleteConfirmed = c.Retention == 0
	if err := cc.Validate(); err != nil {
		return claim.Config{}, publish.Config{}, relay.Config{}, cli.Usage(err)
	}
	tlsConfig, err := c.AMQPTLS.config(c.AMQPURL)
	if err != nil {
		return claim.Config{}, publish.Config{}, relay.Config{}, cli.Usage(err)
	}
	pc := publish.Config{
		TLS:            tlsConfig,
		URL:            c.AMQPURL,
		Exchange:       c.Exchange,
		SkipDeclare:    !c.DeclareExch,
		ConfirmTimeout: c.ConfirmTimeout,
		MaxMessageSize: c.MaxMessageSize,
	}
	if err := pc.Validate(); err != nil {
		if cerr := (*publish.ConfigError)(nil); errors.As(err, &cerr) && cerr.Setting == "URL" {
			err = fmt.Errorf("--amqp-url / AMQP_URL: %w", err)
		}
		return claim.Config{}, publish.Config{}, relay.Config{}, cli.Usage(err)
	}
	cleanup := c.CleanupInterval
	if cleanup == 0 {
		cleanup = -1
	}
	retention := c.Retention
	if retention == 0 {
		retention = -1 // none: cleanup deletes what an earlier run kept
	}
	markDelay := c.MarkDelay
	if markDelay == 0 {
		markDelay = -1 // at once
	}
	rc := relay.Config{
		BatchSize:         c.BatchSize,
		Workers:           c.Workers,
		PollInterval:      c.PollInterval,
		ShutdownTimeout:   c.ShutdownTimeout,
		Retention:         retention,
		CleanupInterval:   cleanup,
		MarkRetry:         c.Lease,
		MarkDelay:         markDelay,
		BusyRate:          c.BusyRate,
		BusyPollInterval:  c.BusyPoll,
		Ordered:           cc.Ordered(),
		CloudEvents:       map[string]string{"cloudevents": relay.CloudEventsBinary, "cloudevents-structured": relay.CloudEventsStructured}[c.MessageFormat],
		CloudEventsSource: c.CESource,
	}
	if err := rc.Validate(); err != nil {
		return claim.Config{}, publish.Config{}, relay.Config{}, cli.Usage(err)
	}
	return cc, pc, rc, nil
}

// Run validates the configuration, reaches both services (failing fast with
// exit code 2), migrates unless told not to, and relays until ctx ends.
func (c *RunCmd) Run(ctx context.Context, stderr io.Writer) (err error) {
	cc, pc, rc, err := c.configs()
	if err != nil {
		return err
	}
	if c.Migrate && !c.migrationsTable(cc) {
		return notMigrationsTable(c.Table)
	}
	log := c.Logger(stderr)
	if c.Procs > 0 {
		runtime.GOMAXPROCS(c.Procs)
	}
	// SIGINT or SIGTERM during start-up cuts a connection attempt or a check
	// short: that is the shutdown asked for, not a failure (found by the
	// fault suite: a SIGTERM while the table was being checked exited 2).
	defer func() {
		if err != nil && ctx.Err() != nil {
			log.Info("stopped during start-up", "err", err)
			err = nil
		}
	}()
	answers := health.NewAnswers(nil)
	pool, err := c.connect(ctx, log, cc, c.Workers, answers)
	if err != nil {
		return err
	}
	defer pool.Close()

	if c.Migrate {
		url, flag := c.sessionURL()
		conn, err := sessionConn(ctx, log, url, flag)
		if err != nil {
			return err
		}
		err = c.setupSchema(ctx, conn, log.With("component", "migrate"), cc)
		conn.Close(context.WithoutCancel(ctx))
		if err != nil {
			return err
		}
	}

	var listener *notify.Listener // nil with --no-listen
	if !c.NoListen {
		// The listener holds the relay's instance lock: claims carry its id
		// while it does (none before the listener connects, nor while it
		// reconnects).
		cc.Instance = func() uint32 { return listener.Instance() }
	}
	store, err := claim.New(pool, cc)
	if err != nil {
		return cli.Usage(err)
	}
	checkCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	err = store.Check(checkCtx)
	cancel()
	if err != nil {
		return cli.Usagef("--table %s: %v", c.Table, err)
	}
	if !c.NoListen {
		checkCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err = c.checkTrigger(checkCtx, pool, log, cc)
		cancel()
		if err != nil {
			return err
		}
	}

	tracer, propagator, stopTracing, err := tracing(ctx, log)
	if err != nil {
		return err
	}
	defer stopTracing() // after the publisher's close: the last spans are flushed
	pc.Tracer, pc.Propagator = tracer, propagator

	pc.Logger = log
	pub, err := publish.Dial(ctx, pc)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return cli.Usagef("RabbitMQ: %v", err)
	}
	defer pub.Close()

	var (
		session *pgx.ConnConfig // the session for LISTEN and the sampler; nil with --no-listen
		wakeups relay.Listener  // nil with --no-listen: the relay polls only
	)
	if !c.NoListen {
		url, flag := c.sessionURL()
		if session, err = pgx.ParseConfig(url); err != nil {
			return cli.Usagef("%s: %v", flag, redact.Error(err, url))
		}
		if err := requirePrimary(&session.Config, url, flag); err != nil {
			return err // LISTEN is refused on a standby
		}
		listener, err = notify.New(notify.Config{
			ConnConfig: session,
			Channel:    c.Channel,
			Pinger:     pool,
			Instance:   true,
			Logger:     log,
		})
		if err != nil {
			return cli.Usage(err)
		}
		wakeups = listener
	}

	if c.Gate && !c.NoListen {
		gate, err := c.gate(ctx, pool, cc)
		if err != nil {
			return err
		}
		if gate != nil {
			rc.Gate, rc.Inserts = gate, store
		} else {
			log.Warn("no notification gate: producers notify on every insert; apply the migrations or re-run sql/outboxrelay_install.sql",
				"gate_sequence", c.GateSeq)
		}
	}

	rc.Floor = store
	rc.Recovery = store
	rc.Logger = log
	var r *relay.Relay
	table, _ := cc.TableIdentifier()
	o, err := c.newOps(opsParts{pool: pool, answers: answers, store: store, listener: listener, session: session, pub: pub,
		ordered: cc.Ordered(), live: func() bool { return r.Live() },
		table: table, tableName: c.Table, channel: c.Channel}, log)
	if err != nil {
		return err
	}
	if o != nil {
		rc.Observer = o.metrics
	}
	r, err = relay.New(rc, store, pub, wakeups)
	if err != nil {
		if o != nil {
			o.ln.Close()
		}
		return cli.Usage(err)
	}
	log.Info("outboxrelay starting", "database", redact.URL(c.DatabaseURL), "amqp", redact.URL(c.AMQPURL),
		"table", c.Table, "exchange", c.Exchange, "ordering", c.Ordering)
	switch {
	case c.NoListen:
		log.Info("poll-only (--no-listen): events wait for the next poll; no session state on the pool",
			"poll_interval", c.PollInterval)
	case cc.Pooled:
		log.Info("--database-url taken for a transaction-mode pool: no session state on it",
			"listener", redact.URL(c.ListenerURL))
	}
	if o != nil {
		opsCtx, stopOps := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		go func() { o.run(opsCtx, ctx); close(done) }()
		defer func() { stopOps(); <-done }()
	}
	if err := r.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// pooled reports whether --database-url is taken for a transaction-mode
// pool: another URL serves the session (--listener-url), or there is none
// (--no-listen).
func (c *RunCmd) pooled() bool {
	return c.NoListen || (c.ListenerURL != "" && c.ListenerURL != c.DatabaseURL)
}

// sessionURL is the URL of the relay's session connections, and the flag
// that gave it.
func (c *RunCmd) sessionURL() (url, flag string) {
	if c.ListenerURL != "" {
		return c.ListenerURL, "--listener-url / OUTBOX_LISTENER_URL"
	}
	return c.DatabaseURL, "--database-url / DATABASE_URL"
}

// gate returns the notification gate, or nil if its sequence does not
// exist (a schema from before the gate).
func (c *RunCmd) gate(ctx context.Context, pool *pgxpool.Pool, cc claim.Config) (*notify.Gate, error) {
	table, err := cc.TableIdentifier()
	if err != nil {
		return nil, cli.Usage(err)
	}
	var seq pgx.Identifier
	if c.GateSeq != "" {
		seq = strings.Split(c.GateSeq, ".")
	} else {
		seq = slices.Clone(table)
		seq[len(seq)-1] += "_wakeup"
		c.GateSeq = strings.Join(seq, ".")
	}
	gate, err := notify.NewGate(pool, c.Channel, table, seq, 0)
	if err != nil {
		return nil, cli.Usagef("--gate-sequence: %v", err)
	}
	checkCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	err = gate.Check(checkCtx)
	if err == nil {
		return gate, nil
	}
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UndefinedTable {
		return nil, nil
	}
	return nil, cli.Usagef("--gate-sequence %s: %v", c.GateSeq, err)
}
