package metrics

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outboxrelay/claim"
)

// Statements of the sampler. The sampling lock is a session-level advisory
// lock on (samplerLockSpace, hashtext of the table): relays of one table
// take turns, relays of different tables do not contend.
const (
	tryLockSQL    = `SELECT pg_try_advisory_lock($1, hashtext($2))`
	unlockSQL     = `SELECT pg_advisory_unlock($1, hashtext($2))`
	queueUsageSQL = `SELECT pg_notification_queue_usage()`
)

// samplerLockSpace is the first key of the sampling lock (the ordering
// index build uses 1868722809).
const samplerLockSpace = 1868722810

// SamplerConfig configures a Sampler.
type SamplerConfig struct {
	// Pool is the relay's pool. The sampler borrows one connection of it
	// while it holds the sampling lock, and one for a moment per interval
	// otherwise. Required.
	Pool *pgxpool.Pool
	// Store reads the table's gauges. Required.
	Store *claim.Store
	// Interval is how often the gauges are read. Default 15s.
	Interval time.Duration
	// Logger receives the sampler's logs. Default: discarded.
	Logger *slog.Logger
}

// Sampler reads the table gauges while it holds the sampling lock, and the
// notification queue's usage always. Create it with Metrics.Sampler.
type Sampler struct {
	cfg SamplerConfig
	m   *Metrics
	log *slog.Logger
	// lockKey names the table in the sampling lock.
	lockKey string
}

// Sampler returns a sampler that sets m's table and notification queue
// gauges.
func (m *Metrics) Sampler(cfg SamplerConfig) (*Sampler, error) {
	if cfg.Pool == nil || cfg.Store == nil {
		return nil, fmt.Errorf("metrics: SamplerConfig: Pool and Store are required")
	}
	if cfg.Interval < 0 {
		return nil, fmt.Errorf("metrics: SamplerConfig.Interval %s: must not be negative", cfg.Interval)
	}
	cfg.Interval = cmp.Or(cfg.Interval, 15*time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	table, err := cfg.Store.Config().TableIdentifier()
	if err != nil {
		return nil, err
	}
	return &Sampler{cfg: cfg, m: m, log: cfg.Logger.With("component", "sampler"), lockKey: table.Sanitize()}, nil
}

// Run samples at once and then every Interval until ctx ends. It tries for
// the sampling lock at every interval while it does not hold it; holding
// it, it keeps the connection and samples on it until a sample fails (the
// connection is then dropped, which frees the lock for another relay). It
// returns nil when ctx ends.
func (s *Sampler) Run(ctx context.Context) error {
	var held *pgxpool.Conn
	defer func() {
		if held != nil {
			s.unlock(ctx, held)
		}
		s.m.sampling.Set(0)
		s.m.table.clear()
	}()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		s.queueUsage(ctx)
		if held == nil {
			held = s.tryLock(ctx)
		}
		if held != nil {
			sample, err := s.cfg.Store.Sample(ctx, held)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				s.log.Warn("sampling the table failed; giving the sampling lock up", "err", err)
				s.drop(held)
				held = nil
			} else {
				s.m.table.set(sample)
			}
		}
		s.m.sampling.Set(b2f(held != nil))
		t.Reset(s.cfg.Interval)
	}
}

func (s *Sampler) queueUsage(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Interval)
	defer cancel()
	var usage float64
	if err := s.cfg.Pool.QueryRow(ctx, queueUsageSQL).Scan(&usage); err != nil {
		if ctx.Err() == nil {
			s.log.Warn("reading the notification queue's usage failed", "err", err)
		}
		return
	}
	s.m.queueUsage.Set(usage)
}

// tryLock borrows a connection and takes the sampling lock on it, or gives
// the connection back and returns nil.
func (s *Sampler) tryLock(ctx context.Context) *pgxpool.Conn {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Interval)
	defer cancel()
	conn, err := s.cfg.Pool.Acquire(ctx)
	if err != nil {
		return nil
	}
	var got bool
	if err := conn.QueryRow(ctx, tryLockSQL, samplerLockSpace, s.lockKey).Scan(&got); err != nil || !got {
		if err != nil && ctx.Err() == nil {
			s.log.Warn("taking the sampling lock failed", "err", err)
		}
		conn.Release()
		return nil
	}
	s.log.Debug("sampling the table gauges", "table", s.lockKey)
	return conn
}

// unlock frees the lock and gives the connection back, or, if the unlock
// fails, closes the connection, which frees it as well.
func (s *Sampler) unlock(ctx context.Context, conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if _, err := conn.Exec(ctx, unlockSQL, samplerLockSpace, s.lockKey); err != nil {
		s.drop(conn)
		return
	}
	conn.Release()
}

// drop closes the connection (freeing its locks) and removes it from the
// pool.
func (s *Sampler) drop(conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Conn().Close(ctx)
	conn.Release()
}
