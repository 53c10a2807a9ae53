package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/publish"
)

// Store is what the relay needs of the outbox store; *claim.Store has it.
type Store interface {
	Claim(ctx context.Context, limit int) (claim.Batch, error)
	MarkPublished(ctx context.Context, ids []int64) (int64, error)
	Retry(ctx context.Context, lease claim.LeaseID, failures []claim.Failure) (claim.RetryResult, error)
	Release(ctx context.Context, lease claim.LeaseID, ids []int64) (int64, error)
	Extend(ctx context.Context, lease claim.LeaseID, ids []int64) (int64, error)
	DeletePublished(ctx context.Context, retention time.Duration, limit int) (int64, error)
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
}

// Relay moves events from the outbox to RabbitMQ.
type Relay struct {
	cfg      Config
	store    Store
	pub      Publisher
	listener Listener
	log      *slog.Logger
	wake     chan struct{}
	// retryDue carries the delay until a retry falls due to the poll loop,
	// which keeps one timer for the earliest.
	retryDue chan time.Duration
	stats    stats
	meter    meter

	// claimBackoff spaces out claims after the database failed one; every
	// worker shares it, and a successful claim resets it.
	claimMu      sync.Mutex
	claimBackoff *backoff.ExponentialBackOff
}

// stats counts what the relay did since the last summary.
type stats struct {
	published, failed, dead, released, extended atomic.Int64
}

// New validates cfg and builds a relay. listener may be nil: the relay then
// relies on its fallback poll alone.
func New(cfg Config, store Store, pub Publisher, listener Listener) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Relay{
		cfg:      cfg,
		store:    store,
		pub:      pub,
		listener: listener,
		log:      cfg.Logger.With("component", "relay"),
		wake:     make(chan struct{}, 1),
		retryDue: make(chan time.Duration, 1),
		claimBackoff: backoff.NewExponentialBackOff(
			backoff.WithInitialInterval(100*time.Millisecond),
			backoff.WithMaxInterval(cfg.PollInterval),
			backoff.WithMaxElapsedTime(0)),
	}, nil
}

// poke asks for a claim pass; pokes made while one is pending coalesce.
func (r *Relay) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run relays events until ctx is cancelled, then shuts down gracefully:
// claiming stops, in-flight batches are confirmed and marked (for at most
// ShutdownTimeout), unpublished leases are released, and the publisher and
// listener are stopped. It returns nil after a shutdown asked for by ctx, or
// the error that stopped a part of the relay.
func (r *Relay) Run(ctx context.Context) error {
	// The publisher and listener outlive the workers: they stop only once
	// the last in-flight batch is settled.
	partsCtx, stopParts := context.WithCancel(context.WithoutCancel(ctx))
	defer stopParts()
	workCtx, stopWork := context.WithCancel(ctx)
	defer stopWork()
	// In-flight batches finish after shutdown begins, for ShutdownTimeout
	// at most.
	drainCtx, stopDrain := context.WithCancel(context.WithoutCancel(ctx))
	defer stopDrain()
	context.AfterFunc(workCtx, func() { time.AfterFunc(r.cfg.ShutdownTimeout, stopDrain) })

	var (
		parts    sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	fail := func(part string, err error) {
		if err == nil || partsCtx.Err() != nil {
			return
		}
		errOnce.Do(func() { firstErr = fmt.Errorf("%s: %w", part, err) })
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
	if r.cfg.Gate != nil {
		loops.Go(func() { r.steer(workCtx) })
	}
	for range r.cfg.Workers {
		loops.Go(func() { r.work(workCtx, drainCtx) })
	}
	r.log.Info("relay started", "workers", r.cfg.Workers, "batch_size", r.cfg.BatchSize, "poll_interval", r.cfg.PollInterval)
	loops.Wait()
	stopParts()
	parts.Wait()
	r.logSummary()
	r.log.Info("relay stopped")
	return firstErr
}

// poll wakes the workers at start and then every PollInterval ±10%, so
// events whose notification was lost wait at most that long. It also wakes
// them whenever a retry this relay scheduled falls due.
func (r *Relay) poll(ctx context.Context) {
	var (
		due   retrySchedule
		retry <-chan time.Time // fires at due[0]; nil when nothing is due
	)
	next := r.cfg.Clock.After(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-next:
			r.poke()
			next = r.cfg.Clock.After(time.Duration(float64(r.cfg.PollInterval) * (0.9 + 0.2*rand.Float64())))
			continue
		case <-retry:
			r.poke()
			due.popUntil(r.cfg.Clock.Now())
		case d := <-r.retryDue:
			due.add(r.cfg.Clock.Now().Add(d))
		}
		retry = nil
		if len(due) > 0 {
			retry = r.cfg.Clock.After(due[0].Sub(r.cfg.Clock.Now()))
		}
	}
}

// retrySchedule holds the times at which retries fall due, earliest first.
type retrySchedule []time.Time

// maxScheduledRetries bounds the schedule; a retry beyond it is found by the
// fallback poll.
const maxScheduledRetries = 1024

// retryResolution folds retries falling due this close together into one
// wake-up.
const retryResolution = 5 * time.Millisecond

// add schedules a wake-up at or a little after at, never before: a claim
// made before a retry's time would not see the row, and nothing would wake
// the relay again until the fallback poll.
func (s *retrySchedule) add(at time.Time) {
	i, _ := slices.BinarySearchFunc(*s, at, time.Time.Compare)
	if i < len(*s) && (*s)[i].Sub(at) < retryResolution {
		return // the next wake-up comes soon after at: it covers both
	}
	if i > 0 && at.Sub((*s)[i-1]) < retryResolution {
		(*s)[i-1] = at // the previous one would come too early: move it to at
		return
	}
	if len(*s) < maxScheduledRetries {
		*s = slices.Insert(*s, i, at)
	}
}

// popUntil drops every time up to now.
func (s *retrySchedule) popUntil(now time.Time) {
	i := 0
	for i < len(*s) && !(*s)[i].After(now) {
		i++
	}
	*s = (*s)[i:]
}

// wakeAfter asks the poll loop to wake the workers once d has passed.
func (r *Relay) wakeAfter(ctx context.Context, d time.Duration) {
	select {
	case r.retryDue <- d:
	case <-ctx.Done():
	}
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
		}
		r.pass(ctx, drainCtx)
	}
}

// pass claims and publishes batches until one comes back short. ctx ends
// claiming; drainCtx bounds the batch in flight.
func (r *Relay) pass(ctx, drainCtx context.Context) {
	for {
		if err := r.pub.WaitReady(ctx); err != nil {
			return
		}
		// The claim itself is not cancelled half-way: a claim whose result
		// is lost would leave its rows leased until the lease expires.
		claimed := r.cfg.Clock.Now() // the lease runs from no earlier than this
		batch, err := r.store.Claim(drainCtx, r.cfg.BatchSize)
		if err != nil {
			r.claimMu.Lock()
			d := r.claimBackoff.NextBackOff()
			r.claimMu.Unlock()
			r.log.Error("claim failed", "err", err, "retry_in", d)
			r.wakeAfter(ctx, d)
			return
		}
		r.claimMu.Lock()
		r.claimBackoff.Reset()
		r.claimMu.Unlock()
		n := len(batch.Events)
		if n == 0 {
			return
		}
		r.meter.observe(batch.Events[n-1].ID)
		if ctx.Err() != nil {
			r.release(batch.Lease, ids(batch.Events))
			return
		}
		full := n == r.cfg.BatchSize
		if full {
			r.poke() // more is waiting: let another worker join in
		}
		r.process(ctx, drainCtx, batch, claimed)
		if !full {
			return
		}
	}
}

// process publishes one claimed batch and settles every row of it: marked
// published, put back for retry, dead-lettered or released. It holds the
// batch's lease until every row is settled.
func (r *Relay) process(ctx, drainCtx context.Context, batch claim.Batch, claimed time.Time) {
	defer r.holdLease(drainCtx, batch, claimed)()
	msgs := make([]publish.Message, 0, len(batch.Events))
	sent := make([]claim.Event, 0, len(batch.Events))
	var failures []claim.Failure
	for _, e := range batch.Events {
		m, err := Message(e)
		if err != nil {
			failures = append(failures, claim.Failure{ID: e.ID, Attempts: e.Attempts, Err: err, Permanent: true})
			continue
		}
		msgs = append(msgs, m)
		sent = append(sent, e)
	}
	results := r.pub.Publish(drainCtx, msgs)

	published := make([]int64, 0, len(sent))
	var unsettled []int64
	for i, err := range results {
		e := sent[i]
		switch {
		case err == nil:
			published = append(published, e.ID)
		case errors.Is(err, publish.ErrInvalid):
			failures = append(failures, claim.Failure{ID: e.ID, Attempts: e.Attempts, Err: err, Permanent: true})
		case drainCtx.Err() != nil:
			// Shutdown cut the publish short: not the event's fault.
			unsettled = append(unsettled, e.ID)
		default:
			failures = append(failures, claim.Failure{ID: e.ID, Attempts: e.Attempts, Err: err})
		}
	}
	r.markPublished(drainCtx, published)
	r.retry(ctx, batch.Lease, failures)
	r.release(batch.Lease, unsettled)
	r.log.Debug("batch settled", "claimed", len(batch.Events), "published", len(published),
		"failed", len(failures), "released", len(unsettled))
}

// holdLease renews the batch's lease while the batch is in flight, from
// half-way through each lease, until the returned stop is called. A
// publish or a mark can outlast a lease: a broker that blocks the
// connection for a resource alarm, a slow link, a database mark retried.
// Without renewal the rows would become claimable while this relay may
// still publish them, and be published twice. A failed renewal is retried
// every tenth of a lease; if the lease lapses anyway, a confirmed publish
// is still marked, and the worst case is a duplicate, never a loss.
func (r *Relay) holdLease(ctx context.Context, b claim.Batch, claimed time.Time) (stop func()) {
	if b.LeaseFor <= 0 || len(b.Events) == 0 {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		held := ids(b.Events)
		expires := claimed.Add(b.LeaseFor)
		next := claimed.Add(b.LeaseFor / 2)
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-r.cfg.Clock.After(next.Sub(r.cfg.Clock.Now())):
			}
			start := r.cfg.Clock.Now()
			n, err := r.store.Extend(ctx, b.Lease, held)
			switch {
			case err != nil:
				if ctx.Err() != nil {
					return
				}
				next = r.cfg.Clock.Now().Add(b.LeaseFor / 10)
				r.log.Warn("extend lease failed", "err", err, "events", len(held), "lease_left", expires.Sub(start).Round(time.Millisecond))
				continue
			case n == 0:
				return // every row is settled, or the lease lapsed
			}
			expires = start.Add(b.LeaseFor)
			next = start.Add(b.LeaseFor / 2)
			r.stats.extended.Add(n)
			r.log.Debug("lease extended", "events", n, "lease", b.LeaseFor)
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// markPublished records confirmed events, retrying a failing database for up
// to MarkRetry (and no later than the shutdown deadline). If it still fails
// the leases expire and the events are published again: a duplicate, never
// a loss.
func (r *Relay) markPublished(drainCtx context.Context, ids []int64) {
	if len(ids) == 0 {
		return
	}
	r.stats.published.Add(int64(len(ids)))
	ctx, cancel := context.WithTimeout(drainCtx, r.cfg.MarkRetry)
	defer cancel()
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(50*time.Millisecond),
		backoff.WithMaxInterval(2*time.Second),
		backoff.WithMaxElapsedTime(0))
	err := backoff.RetryNotify(func() error {
		_, err := r.store.MarkPublished(ctx, ids)
		return err
	}, backoff.WithContext(b, ctx), func(err error, d time.Duration) {
		r.log.Warn("mark published failed, retrying", "err", err, "events", len(ids), "retry_in", d)
	})
	if err != nil {
		r.log.Error("mark published gave up; the events will be published again when their lease expires",
			"err", err, "events", len(ids))
	}
}

func (r *Relay) retry(ctx context.Context, lease claim.LeaseID, failures []claim.Failure) {
	if len(failures) == 0 {
		return
	}
	res, err := r.store.Retry(context.Background(), lease, failures)
	if err != nil {
		r.log.Error("recording failed publishes failed; they are retried when their lease expires",
			"err", err, "events", len(failures))
		return
	}
	r.stats.failed.Add(int64(len(res.Due)))
	r.stats.dead.Add(int64(res.Dead))
	r.log.Warn("publish failed", "err", failures[0].Err, "events", len(failures), "dead_lettered", res.Dead)
	for _, d := range res.Due {
		r.wakeAfter(ctx, d)
	}
}

func (r *Relay) release(lease claim.LeaseID, ids []int64) {
	if len(ids) == 0 {
		return
	}
	if _, err := r.store.Release(context.Background(), lease, ids); err != nil {
		r.log.Error("release failed; the events are claimable when their lease expires", "err", err, "events", len(ids))
		return
	}
	r.stats.released.Add(int64(len(ids)))
	r.log.Info("released unpublished events", "events", len(ids))
}

// summaryInterval is how often the relay logs what it did, if anything.
const summaryInterval = time.Minute

func (r *Relay) summarize(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.cfg.Clock.After(summaryInterval):
			r.logSummary()
		}
	}
}

// logSummary logs at Info what was relayed since the last summary; nothing
// when nothing happened.
func (r *Relay) logSummary() {
	published, failed := r.stats.published.Swap(0), r.stats.failed.Swap(0)
	dead, released := r.stats.dead.Swap(0), r.stats.released.Swap(0)
	extended := r.stats.extended.Swap(0)
	if published+failed+dead+released+extended == 0 {
		return
	}
	r.log.Info("relayed events", "published", published, "retrying", failed, "dead_lettered", dead,
		"released", released, "leases_extended", extended)
}

func ids(events []claim.Event) []int64 {
	out := make([]int64, len(events))
	for i, e := range events {
		out[i] = e.ID
	}
	return out
}

// cleanup deletes old published rows at start and then every
// CleanupInterval, in batches until one comes back short.
func (r *Relay) cleanup(ctx context.Context) {
	for {
		r.cleanupOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-r.cfg.Clock.After(r.cfg.CleanupInterval):
		}
	}
}

func (r *Relay) cleanupOnce(ctx context.Context) {
	var total int64
	for ctx.Err() == nil {
		n, err := r.store.DeletePublished(ctx, r.cfg.Retention, r.cfg.CleanupBatch)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Error("cleanup failed", "err", err)
			}
			break
		}
		total += n
		if n < int64(r.cfg.CleanupBatch) {
			break
		}
	}
	if total > 0 {
		r.log.Info("cleanup deleted published events", "events", total, "older_than", r.cfg.Retention)
	}
}
