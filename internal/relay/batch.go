package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/publish"
)

// process publishes one claimed batch and settles every row of it: marked
// published (or queued for the next claim to mark, see markQueue), put back
// for retry, dead-lettered or released. It holds the batch's lease until
// every row is settled or queued for its mark.
func (r *Relay) process(ctx, drainCtx context.Context, batch claim.Batch, claimed time.Time) {
	defer r.holdLease(drainCtx, batch, claimed)()
	var (
		sent     []claim.Event
		results  []error
		failures []claim.Failure
	)
	start := r.cfg.Clock.Now()
	if ordered(batch) {
		sent, results = batch.Events, r.publishOrdered(drainCtx, batch.Lease, batch.Events)
	} else {
		msgs := make([]publish.Message, 0, len(batch.Events))
		sent = make([]claim.Event, 0, len(batch.Events))
		for _, e := range batch.Events {
			m, err := r.message(e)
			if err != nil {
				failures = append(failures, claim.Failure{ID: e.ID, Attempts: e.Attempts, Err: err, Permanent: true})
				continue
			}
			msgs = append(msgs, m)
			sent = append(sent, e)
		}
		results = r.pub.Publish(drainCtx, msgs)
	}
	confirmedAt := r.cfg.Clock.Now()

	published := make([]int64, 0, len(sent))
	lags := make([]time.Duration, 0, len(sent))
	var unsettled []int64
	for i, err := range results {
		e := sent[i]
		switch {
		case err == nil:
			published = append(published, e.ID)
			lags = append(lags, confirmedAt.Sub(e.CreatedAt))
		case errors.Is(err, errDeadLettered):
			// Settled already, mid-batch.
		case errors.Is(err, errHeldBack):
			unsettled = append(unsettled, e.ID)
		case errors.Is(err, publish.ErrInvalid):
			failures = append(failures, claim.Failure{ID: e.ID, Attempts: e.Attempts, Err: err, Permanent: true})
		case drainCtx.Err() != nil:
			// Shutdown cut the publish short: not the event's fault.
			unsettled = append(unsettled, e.ID)
		default:
			failures = append(failures, claim.Failure{ID: e.ID, Attempts: e.Attempts, Err: err})
		}
	}
	r.confirm(drainCtx, confirmed{ids: published, lags: lags, took: confirmedAt.Sub(start), at: confirmedAt})
	r.retry(ctx, drainCtx, batch.Lease, failures)
	r.release(drainCtx, batch.Lease, unsettled)
	r.log.Debug("batch settled", "claimed", len(batch.Events), "published", len(published),
		"failed", len(failures), "released", len(unsettled))
}

// markPublished records confirmed events, retrying a failing database for up
// to MarkRetry (and no later than the shutdown deadline). If it still fails
// the leases expire and the events are published again: a duplicate, never
// a loss. It reports whether the marks went through.
func (r *Relay) markPublished(drainCtx context.Context, ids []int64) bool {
	if len(ids) == 0 {
		return false
	}
	// Nearly every mark succeeds at once: that needs no timeout context,
	// backoff or timer, which cost a batch of one event more than the rest
	// of its mark.
	_, first := r.store.MarkPublished(drainCtx, ids)
	if first == nil {
		return true
	}
	ctx, cancel := r.withTimeout(drainCtx, r.cfg.MarkRetry)
	defer cancel()
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(50*time.Millisecond),
		backoff.WithMaxInterval(2*time.Second),
		backoff.WithMaxElapsedTime(0),
		backoff.WithClockProvider(r.cfg.Clock))
	var lastErr error
	err := backoff.RetryNotifyWithTimer(func() error {
		if first != nil { // the failure above is the first attempt's
			lastErr, first = first, nil
			return lastErr
		}
		_, err := r.store.MarkPublished(ctx, ids)
		lastErr = err
		return err
	}, backoff.WithContext(b, ctx), func(err error, d time.Duration) {
		r.log.Warn("mark published failed, retrying", "err", err, "events", len(ids), "retry_in", d)
	}, &clockTimer{clock: r.cfg.Clock})
	if err != nil {
		if lastErr != nil && ctx.Err() != nil {
			// The context's own error says only "canceled": the last
			// failure says why the marks did not go through.
			err = fmt.Errorf("%w (last failure: %w)", context.Cause(ctx), lastErr)
		}
		r.log.Error("mark published gave up; the events will be published again when their lease expires",
			"err", err, "events", len(ids))
		return false
	}
	return true
}

// retry records failed publishes: each event goes back on the store's retry
// schedule, and the relay wakes itself when it falls due, or is
// dead-lettered. After shutdown begins it has until the shutdown deadline
// (drainCtx); events whose failure is not recorded are claimable again when
// their lease expires, their attempt counted by the claim.
func (r *Relay) retry(ctx, drainCtx context.Context, lease claim.LeaseID, failures []claim.Failure) {
	if len(failures) == 0 {
		return
	}
	res, err := r.store.Retry(drainCtx, lease, failures)
	if err != nil {
		r.log.Error("recording failed publishes failed; they are retried when their lease expires",
			"err", err, "events", len(failures))
		return
	}
	r.stats.failed.Add(int64(len(res.Due)))
	r.stats.dead.Add(int64(res.Dead))
	r.observeFailures(failures, res.DeadIndex)
	r.log.Warn("publish failed", "err", failures[0].Err, "reason", publish.Reason(failures[0].Err),
		"events", len(failures), "dead_lettered", res.Dead)
	for _, d := range res.Due {
		r.wakeAfter(ctx, d)
	}
}

// release gives back unpublished events without counting an attempt, so
// that they can be claimed again at once: those of a batch that shutdown
// cut short, and those of an ordered batch held back behind a failed event
// of their aggregate. Before shutdown only the store's statement timeout
// bounds it; after, it may run until ReleaseGrace past the shutdown
// deadline (drainCtx's end), and a release that has not finished by then
// leaves the events to their lease's expiry.
func (r *Relay) release(drainCtx context.Context, lease claim.LeaseID, ids []int64) {
	if len(ids) == 0 {
		return
	}
	ctx, cancel := r.graceAfter(drainCtx)
	defer cancel()
	if _, err := r.store.Release(ctx, lease, ids); err != nil {
		r.log.Error("release failed; the events are claimable when their lease expires", "err", err, "events", len(ids))
		return
	}
	r.stats.released.Add(int64(len(ids)))
	r.obs.Released(len(ids))
	r.log.Info("released unpublished events", "events", len(ids))
}

// graceAfter returns a context that ends ReleaseGrace after drainCtx does.
func (r *Relay) graceAfter(drainCtx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(drainCtx))
	timer := make(chan func() bool, 1)
	watching := context.AfterFunc(drainCtx, func() { timer <- r.cfg.Clock.AfterFunc(ReleaseGrace, cancel) })
	return ctx, func() {
		if !watching() { // drainCtx has ended: the timer is armed
			stop := <-timer
			stop()
		}
		cancel()
	}
}

// observeFailures tells the observer, by reason, how many of the recorded
// failures were retried and how many dead-lettered (dead holds the indexes
// of those).
func (r *Relay) observeFailures(failures []claim.Failure, dead []int) {
	type count struct{ retried, dead int }
	byReason := map[string]*count{}
	isDead := make(map[int]bool, len(dead))
	for _, i := range dead {
		isDead[i] = true
	}
	for i, f := range failures {
		reason := publish.Reason(f.Err)
		c := byReason[reason]
		if c == nil {
			c = &count{}
			byReason[reason] = c
		}
		if isDead[i] {
			c.dead++
		} else {
			c.retried++
		}
	}
	for reason, c := range byReason {
		if c.retried > 0 {
			r.obs.Retried(reason, c.retried)
		}
		if c.dead > 0 {
			r.obs.DeadLettered(reason, c.dead)
		}
	}
}

func ids(events []claim.Event) []int64 {
	out := make([]int64, len(events))
	for i, e := range events {
		out[i] = e.ID
	}
	return out
}
