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
	// ShutdownTimeout bounds how long in-flight batches may take to be
	// confirmed and marked after shutdown begins. Default 20s.
	ShutdownTimeout time.Duration
	// Retention is how long published rows are kept before cleanup deletes
	// them. Default 24h.
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
	// Gate, if set, lets the relay silence the outbox trigger's NOTIFY while
	// it is busy claiming anyway (*notify.Gate has it). Default nil:
	// producers always notify.
	Gate Gate
	// BusyRate is the insert rate, in events per second, above which the
	// relay closes the Gate and claims every BusyPollInterval instead of
	// waiting for notifications; below half of it, the relay opens the Gate
	// again. The rate is read from the ids the relay claims over the last
	// 200ms. Only used with a Gate. Default 2000.
	BusyRate float64
	// BusyPollInterval is how often a busy relay claims. Default 2ms.
	BusyPollInterval time.Duration
	// Logger receives the relay's logs. Default: discarded.
	Logger *slog.Logger
	// Clock tells the time and makes timers. Default: the system clock.
	Clock Clock
}

func (c Config) withDefaults() Config {
	c.BatchSize = cmp.Or(c.BatchSize, 500)
	c.Workers = cmp.Or(c.Workers, 4)
	c.PollInterval = cmp.Or(c.PollInterval, 5*time.Second)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, 20*time.Second)
	c.Retention = cmp.Or(c.Retention, 24*time.Hour)
	c.CleanupInterval = cmp.Or(c.CleanupInterval, time.Minute)
	c.CleanupBatch = cmp.Or(c.CleanupBatch, 1000)
	c.MarkRetry = cmp.Or(c.MarkRetry, 30*time.Second)
	c.BusyRate = cmp.Or(c.BusyRate, 2000)
	c.BusyPollInterval = cmp.Or(c.BusyPollInterval, 2*time.Millisecond)
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.Clock == nil {
		c.Clock = SystemClock{}
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
	case c.Retention <= 0:
		return fmt.Errorf("relay: Retention %s: must be positive", c.Retention)
	case c.CleanupBatch < 1:
		return fmt.Errorf("relay: CleanupBatch %d: must be at least 1", c.CleanupBatch)
	case c.MarkRetry <= 0:
		return fmt.Errorf("relay: MarkRetry %s: must be positive", c.MarkRetry)
	case c.BusyRate < 0:
		return fmt.Errorf("relay: BusyRate %g: must not be negative", c.BusyRate)
	case c.BusyPollInterval < 0:
		return fmt.Errorf("relay: BusyPollInterval %s: must not be negative", c.BusyPollInterval)
	}
	return nil
}

// Clock is the relay's source of time.
type Clock interface {
	Now() time.Time
	// After is time.After: a channel that receives once d has passed.
	After(d time.Duration) <-chan time.Time
}

// SystemClock is the real clock.
type SystemClock struct{}

// Now is time.Now.
func (SystemClock) Now() time.Time { return time.Now() }

// After is time.After.
func (SystemClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
