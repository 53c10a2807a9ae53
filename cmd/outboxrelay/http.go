package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime/debug"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/cli"
	"github.com/outboxrelay/outboxrelay/internal/health"
	"github.com/outboxrelay/outboxrelay/internal/metrics"
	"github.com/outboxrelay/outboxrelay/internal/relay"
	"github.com/outboxrelay/outboxrelay/notify"
	"github.com/outboxrelay/outboxrelay/publish"
)

// HTTPFlags configure the operations endpoints.
type HTTPFlags struct {
	HTTPAddr       string        `name:"http-addr" env:"OUTBOX_HTTP_ADDR" default:":9464" help:"Address serving /metrics, /livez and /readyz; empty turns them off."`
	SampleInterval time.Duration `name:"metrics-sample-interval" env:"OUTBOX_METRICS_SAMPLE_INTERVAL" default:"15s" help:"How often one relay of the table samples its gauges (rows by status, oldest pending age); 0 turns the table gauges off."`
	Pprof          bool          `name:"pprof" env:"OUTBOX_PPROF" help:"Also serve Go's runtime profiles under /debug/pprof/ on --http-addr (off by default: they show the process's internals, so keep that address private)."`
}

// tableCheckEvery is how often readiness checks the table and its trigger
// while they are in place; the connections are checked every readinessEvery.
const tableCheckEvery = 15 * time.Second

// readinessEvery is how often the readiness checks run: with the idle
// relay's reading of the id sequence, on the same instants, so that an idle
// relay wakes once for both.
const readinessEvery = relay.IdleInsertsEvery

// postgresAnswersWithin is how recent an answer to one of the relay's
// statements must be for the postgres check to pass without a ping: a
// second longer than the idle relay's reading of the id sequence, which
// comes at the readiness round's instants, so at rest the readiness check
// sends nothing of its own.
const postgresAnswersWithin = relay.IdleInsertsEvery + time.Second

// httpShutdownTimeout bounds the endpoints' shutdown after the relay's.
const httpShutdownTimeout = 5 * time.Second

// ops is the relay's operations side: metrics, the readiness monitor, the
// table sampler and the HTTP server, run beside the relay.
type ops struct {
	metrics *metrics.Metrics
	monitor *health.Monitor
	sampler *metrics.Sampler
	server  *http.Server
	ln      net.Listener
	log     *slog.Logger
}

// opsParts are what the readiness checks look at.
type opsParts struct {
	pool     *pgxpool.Pool
	answers  *health.Answers // the pool's tracer
	store    *claim.Store
	listener *notify.Listener // nil with --no-listen
	session  *pgx.ConnConfig  // the sampler's session; nil with --no-listen
	pub      *publish.Publisher
	ordered  bool
	live     func() bool
	// The table (as an identifier, and as the flag gives it) and the
	// channel, whose trigger the table check looks at.
	table     pgx.Identifier
	tableName string
	channel   string
}

// newOps builds the metrics and the checks and binds the HTTP address, so a
// port in use fails start-up (exit code 2). It returns nil when --http-addr
// is empty.
func (f HTTPFlags) newOps(p opsParts, log *slog.Logger) (*ops, error) {
	if f.HTTPAddr == "" {
		if f.Pprof {
			return nil, cli.Usagef("--pprof / OUTBOX_PPROF: needs --http-addr, which is empty")
		}
		return nil, nil
	}
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, metrics.Options{Version: version(), Ordered: p.ordered})
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	o := &ops{metrics: m, log: log}
	if f.SampleInterval > 0 {
		if o.sampler, err = m.Sampler(metrics.SamplerConfig{Pool: p.pool, Store: p.store, Session: p.session,
			Interval: f.SampleInterval, Logger: log}); err != nil {
			return nil, err
		}
	}
	// PostgreSQL is ready while it answers the relay's own statements; a
	// ping is sent only after postgresAnswersWithin without one.
	checks := []health.Check{{Name: metrics.ServicePostgres, Run: p.answers.Check(postgresAnswersWithin, p.pool.Ping)}}
	if p.listener != nil {
		checks = append(checks, health.Check{Name: metrics.ServiceListener, Run: func(context.Context) error {
			if !p.listener.Connected() {
				return errors.New("not listening")
			}
			return nil
		}})
	}
	checks = append(checks,
		health.Check{Name: metrics.ServiceRabbitMQ, Run: func(context.Context) error {
			connected, blocked := p.pub.State()
			m.SetConnection(metrics.ServiceRabbitMQ, connected)
			m.SetBrokerBlocked(blocked)
			broker := ""
			if connected {
				broker = p.pub.Broker()
			}
			m.SetBroker(broker)
			switch {
			case !connected:
				return errors.New("not connected")
			case blocked:
				return errors.New("connection blocked by the broker (resource alarm)")
			}
			return nil
		}},
		// Catalog queries: every 15 s while they pass. A poll-only relay
		// needs no trigger; a listening one needs one that notifies its
		// channel and tries its channel's locks.
		health.Check{Name: "table", Every: tableCheckEvery, Run: func(ctx context.Context) error {
			if err := p.store.Check(ctx); err != nil || p.listener == nil {
				return err
			}
			ts, err := notify.InspectTriggers(ctx, p.pool, p.table)
			if err != nil {
				return err
			}
			return ts.Check(p.tableName, p.channel)
		}},
	)
	o.monitor, err = health.New(health.Config{
		Interval: readinessEvery,
		Checks:   checks,
		// The rabbitmq check sets its own gauges: connected and blocked
		// apart.
		OnResult: func(name string, err error) {
			if name == metrics.ServicePostgres || name == metrics.ServiceListener {
				m.SetConnection(name, err == nil)
			}
		},
		OnReady: m.SetReady,
		Logger:  log,
	})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError)}))
	mux.Handle("GET /livez", health.LiveHandler(p.live))
	mux.Handle("GET /readyz", o.monitor.ReadyHandler())
	if f.Pprof {
		servePprof(mux)
	}
	o.server = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if o.ln, err = net.Listen("tcp", f.HTTPAddr); err != nil {
		return nil, cli.Usagef("--http-addr / OUTBOX_HTTP_ADDR: %v", err)
	}
	return o, nil
}

// run serves and samples until ctx ends, then shuts the server down
// within httpShutdownTimeout. The readiness checks stop when relayCtx ends,
// at the start of the relay's shutdown (/readyz then answers "shutting
// down"); the endpoints serve until the relay has stopped.
func (o *ops) run(ctx, relayCtx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { _ = o.monitor.Run(relayCtx) })
	if o.sampler != nil {
		wg.Go(func() { _ = o.sampler.Run(ctx) })
	}
	wg.Go(func() {
		if err := o.server.Serve(o.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			o.log.Error("operations endpoints stopped", "err", err)
		}
	})
	o.log.Info("operations endpoints listening", "addr", o.ln.Addr().String())
	<-ctx.Done()
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), httpShutdownTimeout)
	defer cancel()
	_ = o.server.Shutdown(shutdownCtx)
	wg.Wait()
}

// servePprof adds Go's profiling endpoints to mux, under the paths
// `go tool pprof` expects. The handlers come from net/http/pprof, whose
// import also registers them on http.DefaultServeMux, which the relay
// never serves.
func servePprof(mux *http.ServeMux) {
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("POST /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
}

// version is the relay's version from its build information: the module
// version, or the VCS revision of a development build.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			return "devel-" + s.Value[:12]
		}
	}
	return "devel"
}
