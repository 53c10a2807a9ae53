package relay

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/publish"
)

// Store is what the relay needs of the outbox store; *claim.Store has it.
type Store interface {
	// MarkAndClaim marks published and then claims, in one round trip;
	// after an error the relay marks them again on their own.
	MarkAndClaim(ctx context.Context, published []int64, limit int) (claim.Batch, error)
	MarkPublished(ctx context.Context, ids []int64) (int64, error)
	Retry(ctx context.Context, lease claim.LeaseID, failures []claim.Failure) (claim.RetryResult, error)
	Release(ctx context.Context, lease claim.LeaseID, ids []int64) (int64, error)
	Extend(ctx context.Context, lease claim.LeaseID, ids []int64) (int64, error)
	DeletePublished(ctx context.Context, retention time.Duration, limit int) (int64, error)
	// Unblocks reports whether recording f, a failed event of an ordered
	// batch, lets the later events of its aggregate go (a dead-lettered
	// event under the continue policy).
	Unblocks(f claim.Failure) bool
}

// Publisher is what the relay needs of RabbitMQ; *publish.Publisher has it.
type Publisher interface {
	// Run keeps the broker connection up until ctx is cancelled.
	Run(ctx context.Context) error
	// WaitReady blocks while the broker is unreachable or blocked.
	WaitReady(ctx context.Context) error
	// Publish publishes a batch and returns one error per message, nil for
	// each one RabbitMQ confirmed and routed.
	Publish(ctx context.Context, msgs []publish.Message) []error
}

// Listener wakes the relay when new events may be waiting;
// *notify.Listener has it.
type Listener interface {
	Run(ctx context.Context) error
	C() <-chan struct{}
	// Signals counts the wake-ups signalled so far, each once its
	// notification has been received, including those C folded into one
	// already pending.
	Signals() uint64
}

// Relay moves events from the outbox to RabbitMQ.
type Relay struct {
	cfg      Config
	store    Store
	pub      Publisher
	listener Listener
	log      *slog.Logger
	obs      Observer
	wake     chan struct{}
	// retryDue carries the delay until a retry falls due to the poll loop,
	// which keeps one timer for the earliest.
	retryDue chan time.Duration
	// advanceKick wakes an idle advance loop: a claim took rows, or the
	// gate's steering saw a requeue (see advance).
	advanceKick chan struct{}
	// lookAhead asks an idle advance loop to advance although nothing was
	// claimed: a claim came back empty, so the rows that woke it (if any)
	// are not claimable yet (scheduled, or backing off) and the floor
	// parks them with their due times (see advance).
	lookAhead atomic.Bool
	stats     stats
	meter     meter
	marks     markQueue
	// inFlight counts the workers holding a batch; dry is whether the last
	// claim left nothing claimable beyond its batch (see Config.Ordered).
	inFlight atomic.Int32
	dry      atomic.Bool
	// covered is the listener's Signals as read before the latest claim
	// was sent: that claim covers every wake-up counted in it (see work).
	covered atomic.Uint64
	// live is set while Run's loops run (see Live).
	live atomic.Bool
	// db is whether the database answers claims (recovery.go).
	db dbState

	// claimBackoff spaces out claims after the database failed one; every
	// worker shares it, and a successful claim resets it.
	claimMu      sync.Mutex
	claimBackoff *backoff.ExponentialBackOff
}

// New validates cfg and builds a relay. listener may be nil: the relay then
// relies on its fallback poll alone.
func New(cfg Config, store Store, pub Publisher, listener Listener) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Relay{
		cfg:         cfg,
		store:       store,
		pub:         pub,
		listener:    listener,
		log:         cfg.Logger.With("component", "relay"),
		obs:         cfg.Observer,
		wake:        make(chan struct{}, 1),
		marks:       markQueue{kick: make(chan struct{}, 1)},
		retryDue:    make(chan time.Duration, 1),
		advanceKick: make(chan struct{}, 1),
		meter:       meter{wake: make(chan struct{}, 1)},
		db:          newDBState(),
		claimBackoff: backoff.NewExponentialBackOff(
			backoff.WithInitialInterval(100*time.Millisecond),
			backoff.WithMaxInterval(cfg.PollInterval),
			backoff.WithMaxElapsedTime(0),
			backoff.WithClockProvider(cfg.Clock)),
	}, nil
}

// Live reports whether Run's loops are running: from when they have all
// started until shutdown has stopped them. It checks no outside service,
// for a liveness probe.
func (r *Relay) Live() bool { return r.live.Load() }

// poke asks for a claim pass; pokes made while one is pending coalesce.
func (r *Relay) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run relays events until ctx is cancelled, then shuts down gracefully:
// claiming stops, in-flight batches are confirmed, marked or put back for
// retry (until ShutdownTimeout after the cancel at most), the events they
// did not publish are released (for ReleaseGrace more at most), and the
// publisher and listener are stopped. See Config.ShutdownTimeout for the
// bound. It returns nil after a shutdown asked for by ctx, or the error
// that stopped a part of the relay.
func (r *Relay) Run(ctx context.Context) error {
	// The publisher and listener outlive the workers: they stop only once
	// the last in-flight batch is settled.
	partsCtx, stopParts := context.WithCancel(context.WithoutCancel(ctx))
	defer stopParts()
	workCtx, stopWork := context.WithCancel(ctx)
	defer stopWork()
	// In-flight batches finish after shutdown begins, for ShutdownTimeout
	// at most; drainCtx ends then. Only a release of what they did not
	// publish goes on after it, for ReleaseGrace (see release).
	drainCtx, stopDrain := context.WithCancel(context.WithoutCancel(ctx))
	defer stopDrain()
	context.AfterFunc(workCtx, func() { r.cfg.Clock.AfterFunc(r.cfg.ShutdownTimeout, stopDrain) })

	var (
		parts    sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	fail := func(part string, err error) {
		if err == nil || partsCtx.Err() != nil {
			return
		}
		errOnce.Do(func() { firstErr = fmt.Errorf("%s stopped: %w", part, err) })
		stopWork()
	}
	parts.Go(func() { fail("publisher", r.pub.Run(partsCtx)) })
	if r.listener != nil {
		parts.Go(func() { fail("listener", r.listener.Run(partsCtx)) })
	}

	var loops sync.WaitGroup
	loops.Go(func() { r.poll(workCtx) })
	if r.cfg.CleanupInterval > 0 {
		loops.Go(func() { r.cleanup(workCtx) })
	}
	loops.Go(func() { r.summarize(workCtx) })
	if r.cfg.MarkDelay >= 0 {
		loops.Go(func() { r.markLoop(workCtx, drainCtx) })
	}
	if r.cfg.Gate != nil {
		loops.Go(func() { r.steer(workCtx, drainCtx) })
	}
	if r.cfg.Floor != nil {
		loops.Go(func() { r.advance(workCtx) })
	}
	if r.cfg.Recovery != nil {
		loops.Go(func() { r.recover(workCtx) })
	}
	for range r.cfg.Workers {
		loops.Go(func() { r.work(workCtx, drainCtx) })
	}
	r.log.Info("relay started", "workers", r.cfg.Workers, "batch_size", r.cfg.BatchSize, "poll_interval", r.cfg.PollInterval)
	r.live.Store(true)
	loops.Wait()
	r.settle(drainCtx, r.marks.take())
	r.live.Store(false)
	stopParts()
	parts.Wait()
	r.logSummary()
	r.log.Info("relay stopped")
	return firstErr
}

func (r *Relay) work(ctx, drainCtx context.Context) {
	// A notification wakes a worker directly: one goroutine hand-off less
	// on the idle path.
	var notified <-chan struct{}
	if r.listener != nil {
		notified = r.listener.C()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		case <-notified:
			// Notifications that arrive together reach the listener in one
			// read, and C hands each to another waiting worker: all but the
			// first would claim only to find nothing. A claim sent after a
			// notification was received sees its events (or leaves them to
			// the claim that has them locked, or to the pass that claims
			// again after a full or ordered batch, or to the retry after a
			// failed claim), so a wake-up counted before the latest claim
			// was sent needs no claim of its own.
			if r.listener.Signals() <= r.covered.Load() {
				continue
			}
		}
		r.pass(ctx, drainCtx)
	}
}

// cover records that a claim is about to be sent: it covers every wake-up
// the listener has signalled so far.
func (r *Relay) cover() {
	if r.listener == nil {
		return
	}
	n := r.listener.Signals()
	for {
		cur := r.covered.Load()
		if n <= cur || r.covered.CompareAndSwap(cur, n) {
			return
		}
	}
}

// pass claims and publishes batches until one leaves nothing more
// (claim.Batch.More), or, for ordered batches, until one comes back empty.
// ctx ends claiming; drainCtx bounds the batch in flight.
func (r *Relay) pass(ctx, drainCtx context.Context) {
	for {
		if err := r.pub.WaitReady(ctx); err != nil {
			return
		}
		if err := r.db.wait(ctx); err != nil {
			return
		}
		// The claim itself is not cancelled half-way: a claim whose result
		// is lost leaves its rows leased until the Recovery gives them back
		// (once the database answers) or the lease expires.
		claimed := r.cfg.Clock.Now() // the lease runs from no earlier than this
		r.cover()
		marks := r.marks.take()
		batch, err := r.store.MarkAndClaim(drainCtx, markIDs(marks), r.cfg.BatchSize)
		if err != nil {
			r.claimMu.Lock()
			d := r.claimBackoff.NextBackOff()
			r.claimMu.Unlock()
			r.log.Error("claim failed", "err", err, "retry_in", d)
			r.claimFailed(drainCtx, err, marks)
			r.wakeAfter(ctx, d)
			return
		}
		r.marked(marks)
		r.claimMu.Lock()
		r.claimBackoff.Reset()
		r.claimMu.Unlock()
		n := len(batch.Events)
		r.obs.Claimed(n, r.cfg.Clock.Now().Sub(claimed))
		r.dry.Store(!batch.More)
		if n == 0 {
			r.lookAhead.Store(true)
			r.kickAdvance()
			// A due row the claim could not take (another transaction
			// holds it) is looked at again soon (claim.Store.ParkedDue),
			// sooner than a busy advance loop's next tick.
			r.wakeForParked()
			return
		}
		r.meter.observe(batch.Events[n-1].Seq) // a batch is in Seq order
		r.wakeForParked()
		if ctx.Err() != nil {
			r.release(drainCtx, batch.Lease, ids(batch.Events))
			return
		}
		if batch.More {
			r.poke() // more is waiting: let another worker join in
		}
		r.inFlight.Add(1)
		r.process(ctx, drainCtx, batch, claimed)
		r.inFlight.Add(-1)
		// An ordered batch may have held back an aggregate's later events,
		// written meanwhile: their notification found the aggregate blocked
		// by this batch's head, and nothing else would wake a claim for
		// them before the fallback poll. Claim again now that it is done.
		if !batch.More && !ordered(batch) {
			return
		}
	}
}
