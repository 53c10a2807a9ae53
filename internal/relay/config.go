package relay

import (
	"cmp"
	"fmt"
	"io"
	"log/slog"
	"time"
)

// Config configures a Relay. The zero value is usable: every field documents
// its default.
type Config struct {
	// BatchSize is the most events one claim takes. Default 500.
	BatchSize int
	// Workers is how many claim-publish loops run at once; each has at most
	// one batch in flight. Default 4.
	Workers int
	// PollInterval is the fallback poll that finds what notifications missed,
	// jittered by ±10%. Default 5s.
	PollInterval time.Duration
	// ShutdownTimeout bounds shutdown. From the moment it begins (Run's
	// context is cancelled, or a part of the relay failed), everything
	// still under way (a claim, the publishing and confirming of in-flight
	// batches, their marks, their failures' retries, their lease renewals,
	// opening the Gate) has ShutdownTimeout to finish. The events those
	// batches did not publish are then released, for ReleaseGrace more at
	// most. So Run returns within ShutdownTimeout + ReleaseGrace of the
	// start of shutdown, given a store, publisher, listener and gate that
	// honour their contexts. Whatever is cut short stays leased until its
	// lease expires and is claimed again then: a confirmed event not marked
	// is published twice, none is lost. Default 20s.
	ShutdownTimeout time.Duration
	// Retention is how long published rows are kept before cleanup deletes
	// them; negative keeps them no time, so cleanup deletes every published
	// row it finds (the store then deletes confirmed events' rows itself:
	// claim.Config.DeleteConfirmed). Default 24h.
	Retention time.Duration
	// CleanupInterval is how often cleanup runs; negative turns it off.
	// Default 1m.
	CleanupInterval time.Duration
	// CleanupBatch is how many rows one cleanup statement deletes. Default
	// 1000.
	CleanupBatch int
	// MarkRetry is how long a failing mark is retried before giving up (the
	// lease then expires and the events are published again). Default 30s.
	MarkRetry time.Duration
	// MarkDelay is how long the marks of confirmed events may wait for
	// the next claim, which then carries them: the mark and the claim go
	// in one round trip and one commit (claim.Store.MarkAndClaim). Marks
	// that have waited MarkDelay with no claim to carry them are made on
	// their own, and shutdown makes what is left. Marks that wait are
	// lost if the relay dies, and those events are published again once
	// their lease expires. Negative marks every batch as soon as it is
	// confirmed. Default 20ms.
	MarkDelay time.Duration
	// Floor, if set, keeps claims off the row versions a long transaction
	// leaves in the pending index (*claim.Store has it; see
	// claim.Store.Advance): the relay moves it every AdvanceInterval while
	// it claims, and wakes to claim rows parked below it when they fall
	// due. Default nil: claims walk the pending index from its head.
	Floor Floor
	// AdvanceInterval is how often the relay moves the Floor while it
	// claims. Default 50ms.
	AdvanceInterval time.Duration
	// Recovery, if set, frees the rows that claims hold but no relay will
	// settle, sooner than their lease (*claim.Store has it): with a Floor,
	// the rows of relays that died, rescued after each advance; and the
	// rows of this relay's claims that failed after they may have reached
	// the database, given back once a probe shows the database answers
	// again. After a claim that failed without the server's answer, the
	// workers wait for that probe instead of sending claims that would
	// wait their whole timeout. Default nil: such rows wait for their
	// lease, and a failed claim is retried with backoff.
	Recovery Recovery
	// Gate, if set, lets the relay silence the outbox trigger's NOTIFY while
	// it is busy claiming anyway (*notify.Gate has it). Default nil:
	// producers always notify.
	Gate Gate
	// BusyRate is the insert rate, in events per second, above which the
	// relay closes the Gate and claims every BusyPollInterval instead of
	// waiting for notifications; below half of it, the relay opens the Gate
	// again. The rate is the growth, over the last 200ms, of the highest id
	// seen: the ids the relay claims and, with Inserts, the id sequence's
	// last value. With Inserts, the relay also closes the Gate below
	// BusyRate when producers queue on PostgreSQL's NOTIFY lock (see
	// Inserts), and then opens it below a quarter of the rate at which it closed.
	// Only used with a Gate. Default 1000: twice the claims a busy poll
	// makes at the default BusyPollInterval, so the Gate opens where an
	// open gate's claim per notification costs what polling does
	// (decision 0009).
	BusyRate float64
	// Inserts, if set, reads the producers' pace (*claim.Store has it):
	// how far they have inserted (the id sequence's last value) and how
	// many of their commits queue on PostgreSQL's NOTIFY lock. The relay
	// reads the sequence every 50ms while the Gate is closed, and while it
	// is open every 50ms after a claim and every IdleInsertsEvery
	// otherwise: when the sequence moves past the ids claimed with nothing
	// claimed meanwhile, the notifications did not come (the trigger
	// disabled, a notification lost), and the relay claims (and closes the Gate above BusyRate)
	// rather than leave the events to PollInterval. It reads the lock's
	// waiters at a reading after a claim while the Gate is open and the
	// rate is at least 100/s, and closes the Gate when they average 2 over
	// the last 200ms: notifying producers are then held back to one commit
	// per WAL flush, which may be below BusyRate. Without it the rate is
	// read from the ids claimed alone, and a relay that falls behind
	// (starved of CPU, or failing its publishes) sees a rate below the
	// producers' and opens the Gate while they still insert fast. Default
	// nil.
	Inserts Inserts
	// BusyPollInterval is how often a busy relay claims. Default 2ms.
	BusyPollInterval time.Duration
	// Ordered tells the relay that the store claims in ordered mode
	// (claim.Config.Ordered). A busy relay then skips its poll while a
	// worker has a batch in flight and the last claim found no claimable
	// aggregate beyond its batch (claim.Batch.More): such a claim walks
	// every aggregate to find nothing, and the worker in flight claims
	// again, round the whole table, as soon as its batch settles.
	// Default false.
	Ordered bool
	// CloudEvents, if set, publishes every event as a CloudEvent in that
	// content mode: CloudEventsBinary or CloudEventsStructured (see
	// cloudevents.go for the mapping from the row). Default "": the plain
	// message of Message.
	CloudEvents string
	// CloudEventsSource is the CloudEvents source attribute of every
	// event. Default "outboxrelay".
	CloudEventsSource string
	// Observer is told what the relay does, for metrics. Default: nobody.
	Observer Observer
	// Logger receives the relay's logs. Default: discarded.
	Logger *slog.Logger
	// Clock tells the time and makes timers. Default: the system clock.
	Clock Clock
}

// ReleaseGrace is how long past Config.ShutdownTimeout the relay may take
// to release the events of in-flight batches that shutdown cut short, so
// that the relays that stay can claim them at once instead of after their
// lease.
const ReleaseGrace = 2 * time.Second

func (c Config) withDefaults() Config {
	c.BatchSize = cmp.Or(c.BatchSize, 500)
	c.Workers = cmp.Or(c.Workers, 4)
	c.PollInterval = cmp.Or(c.PollInterval, 5*time.Second)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, 20*time.Second)
	c.Retention = cmp.Or(c.Retention, 24*time.Hour)
	c.CleanupInterval = cmp.Or(c.CleanupInterval, time.Minute)
	c.CleanupBatch = cmp.Or(c.CleanupBatch, 1000)
	c.MarkRetry = cmp.Or(c.MarkRetry, 30*time.Second)
	c.MarkDelay = cmp.Or(c.MarkDelay, 20*time.Millisecond)
	c.BusyRate = cmp.Or(c.BusyRate, 1000)
	c.BusyPollInterval = cmp.Or(c.BusyPollInterval, 2*time.Millisecond)
	c.AdvanceInterval = cmp.Or(c.AdvanceInterval, 50*time.Millisecond)
	c.CloudEventsSource = cmp.Or(c.CloudEventsSource, "outboxrelay")
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.Clock == nil {
		c.Clock = SystemClock{}
	}
	if c.Observer == nil {
		c.Observer = noObserver{}
	}
	return c
}

// Validate reports the first setting that cannot work, naming it.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.BatchSize < 1:
		return fmt.Errorf("relay: BatchSize %d: must be at least 1", c.BatchSize)
	case c.Workers < 1:
		return fmt.Errorf("relay: Workers %d: must be at least 1", c.Workers)
	case c.PollInterval <= 0:
		return fmt.Errorf("relay: PollInterval %s: must be positive", c.PollInterval)
	case c.ShutdownTimeout <= 0:
		return fmt.Errorf("relay: ShutdownTimeout %s: must be positive", c.ShutdownTimeout)
	case c.CleanupBatch < 1:
		return fmt.Errorf("relay: CleanupBatch %d: must be at least 1", c.CleanupBatch)
	case c.MarkRetry <= 0:
		return fmt.Errorf("relay: MarkRetry %s: must be positive", c.MarkRetry)
	case c.BusyRate < 0:
		return fmt.Errorf("relay: BusyRate %g: must not be negative", c.BusyRate)
	case c.BusyPollInterval < 0:
		return fmt.Errorf("relay: BusyPollInterval %s: must not be negative", c.BusyPollInterval)
	case c.CloudEvents != "" && c.CloudEvents != CloudEventsBinary && c.CloudEvents != CloudEventsStructured:
		return fmt.Errorf("relay: CloudEvents %q: want %q, %q or empty", c.CloudEvents, CloudEventsBinary, CloudEventsStructured)
	}
	return nil
}
