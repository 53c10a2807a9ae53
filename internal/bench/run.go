package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Run prepares the schema and the consumer, runs the selected workloads in
// order (drain, steady, idle, producer, ordered, scale, horizon) and
// returns one Result per row. On failure it returns the results so far with the error. Unless cfg.Keep,
// the schema is dropped and the exchange deleted at the end, whatever
// happened. Run refuses a schema it did not create, and deletes only an
// exchange it created.
func Run(ctx context.Context, cfg Config) (results []Result, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	r := &runner{cfg: cfg, log: cfg.Logger.With("component", "bench"), clock: newClock(), payloads: newPayloads(cfg.PayloadBytes)}
	defer func() { err = errors.Join(err, r.close(context.WithoutCancel(ctx))) }()
	if err := r.open(ctx); err != nil {
		return nil, err
	}
	for _, w := range []struct {
		name string
		run  func(context.Context) error
	}{
		{WorkloadDrain, r.drain},
		{WorkloadSteady, r.steady},
		{WorkloadIdle, r.idle},
		{WorkloadProducer, r.producer},
		{WorkloadOrdered, r.ordered},
		{WorkloadScale, r.scale},
		{WorkloadScheduled, r.scheduled},
		{WorkloadEarlyIDs, r.earlyIDs},
		{WorkloadBursts, r.bursts},
		{WorkloadSteps, r.steps},
		{WorkloadHorizon, r.horizon},
	} {
		if !cfg.runs(w.name) {
			continue
		}
		if err := w.run(ctx); err != nil {
			return r.results, fmt.Errorf("%s: %w", w.name, err)
		}
	}
	return r.results, nil
}

// runner holds what the workloads share.
type runner struct {
	cfg      Config
	log      *slog.Logger
	clock    clock
	payloads payloads
	db       *database
	consumer *consumer
	// ids numbers events over the whole run, so no two runs share one.
	ids     atomic.Int64
	results []Result
}

// open connects, creates the schema, migrates it with "outboxrelay migrate",
// drops the ordering index a kept schema may have (only ordered runs have
// it) and starts the consumer.
func (r *runner) open(ctx context.Context) error {
	db, err := openDatabase(ctx, r.cfg.DatabaseURL, r.cfg.Schema)
	if err != nil {
		return err
	}
	r.db = db
	if err := r.migrate(ctx); err != nil {
		return err
	}
	if err := r.db.dropOrderingIndex(ctx); err != nil {
		return err
	}
	c, err := newConsumer(r.cfg.AMQPURL, r.cfg.Exchange, r.clock)
	if err != nil {
		return err
	}
	r.consumer = c
	return nil
}

// migrate runs the relay binary's own migrations into the schema.
func (r *runner) migrate(ctx context.Context) error {
	p, err := startProcess("outboxrelay migrate", r.cfg.RelayBinary, []string{"migrate"}, r.env("outboxrelay-bench-migrate"))
	if err != nil {
		return err
	}
	select {
	case <-p.Done():
	case <-ctx.Done():
		return errors.Join(ctx.Err(), p.stop())
	}
	if p.err != nil {
		return fmt.Errorf("outboxrelay migrate: %w: %s", p.err, p.out.last())
	}
	return nil
}

// close stops the consumer and, unless Keep, drops the schema (which is
// the benchmark's own, see prepareSchema) and deletes the exchange if the
// benchmark created it.
func (r *runner) close(ctx context.Context) error {
	var errs []error
	if r.consumer != nil {
		errs = append(errs, r.consumer.Close())
	}
	if r.db != nil {
		if !r.cfg.Keep {
			errs = append(errs, r.db.dropSchema(ctx))
		}
		r.db.Close()
	}
	switch {
	case r.cfg.Keep || r.consumer == nil:
	case r.consumer.createdExchange:
		errs = append(errs, deleteExchange(r.cfg.AMQPURL, r.cfg.Exchange))
	default:
		r.log.Warn("the exchange existed before the benchmark: kept", "exchange", r.cfg.Exchange)
	}
	return errors.Join(errs...)
}

func deleteExchange(amqpURL, name string) error {
	conn, err := dialAMQP(amqpURL, "outboxrelay-bench-cleanup")
	if err != nil {
		return fmt.Errorf("delete exchange: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("delete exchange: open channel: %w", err)
	}
	if err := ch.ExchangeDelete(name, false, false); err != nil {
		var aerr *amqp.Error
		if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
			return nil
		}
		return fmt.Errorf("delete exchange %q: %w", name, err)
	}
	return nil
}

// env is a child's whole environment; applicationName marks its
// PostgreSQL connections.
func (r *runner) env(applicationName string) []string {
	return []string{
		"PATH=" + os.Getenv("PATH"),
		"DATABASE_URL=" + r.db.url(applicationName),
		"AMQP_URL=" + r.cfg.AMQPURL,
		"OUTBOX_EXCHANGE=" + r.cfg.Exchange,
		"OUTBOX_LOG_FORMAT=json",
		"OUTBOX_LOG_LEVEL=warn",
	}
}

// system is a running relay (ordered or not) or naive poller.
type system struct {
	name string
	proc *process
	app  string
	// metrics is the address of a relay's metrics endpoint ("" for the
	// naive poller).
	metrics string
}

// start starts a system under a unique application_name: the relay
// ("outboxrelay run" plus RelayArgs), the ordered relay ("outboxrelay run
// --ordering=aggregate" plus RelayArgs; it creates the ordering index as
// it migrates), both from RelayBinary, or the naive poller
// ("outboxrelay-bench naive-relay", from NaiveBinary).
func (r *runner) start(name string, extra ...string) (*system, error) {
	binary, command, args := r.cfg.RelayBinary, "outboxrelay", append([]string{"run"}, extra...)
	switch name {
	case SystemNaive:
		binary, command, args = r.cfg.NaiveBinary, "outboxrelay-bench", []string{"naive-relay"}
	case SystemKeyscan:
		args = append(args, "--ordering=aggregate")
	}
	what := command + " " + strings.Join(args, " ")
	if name != SystemNaive {
		args = append(args, r.cfg.RelayArgs...)
	}
	app := "outboxrelay-bench-" + name + "-" + randomHex(4)
	env := r.env(app)
	var metrics string
	if name != SystemNaive {
		// The relay serves its metrics where --relay-arg=--http-addr= says,
		// or nowhere if that is empty; by default on a port of its own.
		addr, set := relayHTTPAddr(r.cfg.RelayArgs)
		if !set {
			var err error
			if addr, err = freeAddr(); err != nil {
				return nil, err
			}
			env = append(env, "OUTBOX_HTTP_ADDR="+addr)
		}
		metrics = addr
	}
	p, err := startProcess(what, binary, args, env)
	if err != nil {
		return nil, err
	}
	return &system{name: name, proc: p, app: app, metrics: metrics}, nil
}

// reset prepares a run: the consumer stops noting events, the queue is
// emptied up to a barrier, the outbox is truncated. No system may be
// running.
func (r *runner) reset(ctx context.Context) error {
	r.consumer.track(nil)
	if err := r.consumer.purge(ctx, r.cfg.DrainWait); err != nil {
		return err
	}
	return r.db.truncate(ctx)
}

// newRecord reserves size event numbers and makes the consumer note their
// arrival.
func (r *runner) newRecord(size int) *record {
	rec := newRecord(r.ids.Add(int64(size))-int64(size), size)
	r.consumer.track(rec)
	return rec
}

// newShapedRecord is newRecord for a paced run: with aggregates (not 0),
// its events are spread over that many aggregates and the order of their
// first arrivals is checked.
func (r *runner) newShapedRecord(size, aggregates int) *record {
	if aggregates == 0 {
		return r.newRecord(size)
	}
	rec := newShapedRecord(r.ids.Add(int64(size))-int64(size), size, aggregates)
	r.consumer.track(rec)
	return rec
}

// warmUp writes one event and waits until it arrives, proving sys ready.
func (r *runner) warmUp(ctx context.Context, sys *system, ps *producers) error {
	rec := r.newRecord(1)
	if err := ps.insert(ctx, ps.conns[0], rec.number(0)); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	rec.commit(0, r.clock.now())
	ok, err := r.await(ctx, rec, 1, r.cfg.DrainWait, false, sys)
	switch {
	case err != nil:
		return fmt.Errorf("warm-up: %w", err)
	case !ok:
		return fmt.Errorf("warm-up: the %s did not deliver an event within %s", sys.name, r.cfg.DrainWait)
	}
	return nil
}

// await waits until want events of rec have arrived and reports whether
// they did. It gives up after limit or, with stall, once limit passes
// without a new arrival. It fails if ctx ends, the consumer stops or one
// of systems (nil for none) exits.
func (r *runner) await(ctx context.Context, rec *record, want int64, limit time.Duration, stall bool, systems ...*system) (bool, error) {
	exited := make(chan *system, len(systems))
	done := make(chan struct{})
	defer close(done)
	for _, sys := range systems {
		if sys == nil {
			continue
		}
		go func() {
			select {
			case <-sys.proc.Done():
				exited <- sys
			case <-done:
			}
		}()
	}
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for rec.count() < want {
		select {
		case <-rec.progress:
			if stall {
				timer.Reset(limit)
			}
		case <-timer.C:
			return false, nil
		case <-ctx.Done():
			return false, ctx.Err()
		case <-r.consumer.Done():
			return false, r.consumer.Err()
		case sys := <-exited:
			return false, sys.proc.exitError()
		}
	}
	return true, nil
}

// awaitPending waits until no row is pending, polling, for at most limit.
func (r *runner) awaitPending(ctx context.Context, limit time.Duration, sys *system) (bool, error) {
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		n, err := r.db.pending(ctx)
		if err != nil || n == 0 {
			return n == 0, err
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return false, ctx.Err()
		case <-sys.proc.Done():
			return false, sys.proc.exitError()
		}
	}
}

// startMetered starts the system name and begins to meter its cost.
func (r *runner) startMetered(ctx context.Context, name string, args ...string) (*system, *costMeter, error) {
	sys, err := r.start(name, args...)
	if err != nil {
		return nil, nil, err
	}
	meter, err := beginCost(ctx, r.db, sys)
	if err != nil {
		stopSystem(sys, &err)
		return nil, nil, err
	}
	return sys, meter, nil
}

// startWarm empties the table, starts the system name (with the relay's
// extra arguments, if any) and waits until it has delivered one event of
// ps.
func (r *runner) startWarm(ctx context.Context, ps *producers, name string, extra ...string) (*system, error) {
	if err := r.reset(ctx); err != nil {
		return nil, err
	}
	sys, err := r.start(name, extra...)
	if err != nil {
		return nil, err
	}
	if err := r.warmUp(ctx, sys, ps); err != nil {
		stopSystem(sys, &err)
		return nil, err
	}
	return sys, nil
}

// startProducing opens n producer connections and starts the system name
// warmed up through them (startWarm); the caller closes ps and stops sys.
func (r *runner) startProducing(ctx context.Context, n int, name string) (*producers, *system, error) {
	ps, err := r.db.connectProducers(ctx, n, r.payloads)
	if err != nil {
		return nil, nil, err
	}
	sys, err := r.startWarm(ctx, ps, name)
	if err != nil {
		ps.Close()
		return nil, nil, err
	}
	return ps, sys, nil
}

// stopSystem stops sys; its error becomes *err unless there already is one
// (often the same exit, seen earlier).
func stopSystem(sys *system, err *error) {
	if stopErr := sys.proc.stop(); stopErr != nil && *err == nil {
		*err = stopErr
	}
}
