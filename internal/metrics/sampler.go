package metrics

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/lockkey"
)

// Statements of the sampler. The sampling lock is a session-level advisory
// lock on (samplerLockSpace, hashtext of the table): relays of one table
// take turns, relays of different tables do not contend.
const (
	tryLockSQL    = `SELECT pg_try_advisory_lock($1, hashtext($2))`
	unlockSQL     = `SELECT pg_advisory_unlock($1, hashtext($2))`
	queueUsageSQL = `SELECT pg_notification_queue_usage()`
)

// minOpTimeout is the least time the sampler gives one of its statements,
// or the opening of its session, however short its Interval: a session
// takes a fork of a server process to open, which a loaded server may not
// do within a short interval.
const minOpTimeout = 5 * time.Second

// samplerLockSpace is the first key of the sampling lock.
const samplerLockSpace = lockkey.Sampler

// SamplerConfig configures a Sampler.
type SamplerConfig struct {
	// Pool is the relay's pool, on which the sampler reads the
	// notification queue's usage. Required.
	Pool *pgxpool.Pool
	// Store reads the table's gauges. Required.
	Store *claim.Store
	// Session says where the sampler opens the connection it holds the
	// sampling lock on, and samples on, while it holds it. A session
	// advisory lock needs a session of its own: a direct connection or a
	// session-mode pool, never a transaction-mode pool such as PgBouncer's,
	// which would leave the lock behind on whichever server connection ran
	// it. The sampler keeps this one connection open. Nil: there is no such
	// session (the relay's --no-listen), so there is no lock either, and
	// the sampler samples through Store on every interval, as every other
	// relay of the table does.
	Session *pgx.ConnConfig
	// Interval is how often the gauges are read. Default 15s. Each of the
	// sampler's statements, and the opening of its session, may take as
	// long, and at least 5s.
	Interval time.Duration
	// Logger receives the sampler's logs. Default: discarded.
	Logger *slog.Logger
	// Now tells the time by which the sampler ages the holders of vacuum's
	// horizon whose transaction start PostgreSQL does not show it (a
	// standby's feedback, a replication slot, another role's session).
	// Default time.Now.
	Now func() time.Time
}

// Sampler reads the table gauges and what holds back vacuum's horizon while
// it holds the sampling lock, and the notification queue's usage always.
// Create it with Metrics.Sampler.
type Sampler struct {
	cfg SamplerConfig
	m   *Metrics
	log *slog.Logger
	// horizon ages the holders of vacuum's horizon between samples.
	horizon horizon
	// lockKey names the table in the sampling lock.
	lockKey string
	// settings are the store's statement settings, applied to the
	// sampler's session statement by statement.
	settings map[string]string
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
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Session != nil {
		cfg.Session = cfg.Session.Copy()
		if cfg.Session.RuntimeParams["application_name"] == "" {
			cfg.Session.RuntimeParams["application_name"] = "outboxrelay-sampler"
		}
	}
	table, err := cfg.Store.Config().TableIdentifier()
	if err != nil {
		return nil, err
	}
	return &Sampler{cfg: cfg, m: m, log: cfg.Logger.With("component", "sampler"), lockKey: table.Sanitize(),
		settings: cfg.Store.Config().Settings()}, nil
}

// Run samples at once and then every Interval until ctx ends. With a
// Session, it opens its connection and tries for the sampling lock on it
// at every interval while it does not hold it; holding it, it samples on
// that connection until a sample of the table fails (the connection is
// then closed, which frees the lock for another relay). A failed reading
// of vacuum's horizon only leaves its gauges out until the next. It
// returns nil when ctx ends.
func (s *Sampler) Run(ctx context.Context) error {
	var (
		conn *pgx.Conn // the session, while open
		held bool      // conn holds the sampling lock
	)
	defer func() {
		if conn != nil {
			s.close(ctx, conn, held)
		}
		s.m.sampling.Set(0)
		s.clear()
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
		var (
			db      claim.DB // where to sample the table this round, if anywhere
			horizon querier  // and vacuum's horizon
		)
		if s.cfg.Session == nil {
			db, horizon = nil, s.cfg.Pool // the store's own
		} else {
			if conn == nil {
				conn = s.dial(ctx)
			}
			if conn != nil && !held {
				var err error
				if held, err = s.tryLock(ctx, conn); err != nil {
					s.close(ctx, conn, false)
					conn = nil
				}
			}
			if !held {
				s.m.sampling.Set(0)
				t.Reset(s.cfg.Interval)
				continue
			}
			db, horizon = claim.NewLocalSettings(conn, s.settings), conn
		}
		sample, err := s.cfg.Store.Sample(ctx, db)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			s.log.Warn("sampling the table failed", "err", err)
			if conn != nil {
				// Closing the session frees the lock for another relay.
				s.close(ctx, conn, false)
				conn, held = nil, false
			}
			s.clear()
			s.m.sampling.Set(0)
		} else {
			// Every gauge of the sample is in place once the sampler
			// says it samples.
			s.sampleHorizon(ctx, horizon)
			s.m.table.set(sample)
			s.m.sampling.Set(1)
		}
		t.Reset(s.cfg.Interval)
	}
}

// sampleHorizon reads what holds back vacuum's horizon on db and sets its
// gauges; if that fails, it logs why and leaves them out until the next
// sample, rather than export a stale age.
func (s *Sampler) sampleHorizon(ctx context.Context, db querier) {
	opCtx, cancel := context.WithTimeout(ctx, s.opTimeout())
	defer cancel()
	rows, err := readHorizon(opCtx, db)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("reading what holds back vacuum's horizon failed", "err", err)
		}
		s.horizon.reset()
		s.m.horizon.clear()
		return
	}
	s.m.horizon.set(s.horizon.observe(rows, s.cfg.Now()))
}

// clear takes the sampled gauges out and forgets the holders seen: a relay
// that samples no more exports none.
func (s *Sampler) clear() {
	s.m.table.clear()
	s.m.horizon.clear()
	s.horizon.reset()
}

// opTimeout bounds one statement of the sampler, or the opening of its
// session: the Interval, and at least minOpTimeout.
func (s *Sampler) opTimeout() time.Duration { return max(s.cfg.Interval, minOpTimeout) }

func (s *Sampler) queueUsage(ctx context.Context) {
	opCtx, cancel := context.WithTimeout(ctx, s.opTimeout())
	defer cancel()
	var usage float64
	if err := s.cfg.Pool.QueryRow(opCtx, queueUsageSQL).Scan(&usage); err != nil {
		if ctx.Err() == nil {
			s.log.Warn("reading the notification queue's usage failed", "err", err)
		}
		return
	}
	s.m.queueUsage.Set(usage)
}

// dial opens the sampler's session, or returns nil after logging why not.
func (s *Sampler) dial(ctx context.Context) *pgx.Conn {
	opCtx, cancel := context.WithTimeout(ctx, s.opTimeout())
	defer cancel()
	conn, err := pgx.ConnectConfig(opCtx, s.cfg.Session)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("connecting for the sampling lock failed", "err", err)
		}
		return nil
	}
	return conn
}

// tryLock tries for the sampling lock on conn. An error means the
// connection is no good.
func (s *Sampler) tryLock(ctx context.Context, conn *pgx.Conn) (bool, error) {
	opCtx, cancel := context.WithTimeout(ctx, s.opTimeout())
	defer cancel()
	var got bool
	if err := conn.QueryRow(opCtx, tryLockSQL, samplerLockSpace, s.lockKey).Scan(&got); err != nil {
		if ctx.Err() == nil {
			s.log.Warn("taking the sampling lock failed", "err", err)
		}
		return false, err
	}
	if got {
		s.log.Debug("sampling the table gauges", "table", s.lockKey)
	}
	return got, nil
}

// close frees the lock if held (closing the session frees it as well,
// should the unlock fail) and closes the session.
func (s *Sampler) close(ctx context.Context, conn *pgx.Conn, held bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if held {
		_, _ = conn.Exec(ctx, unlockSQL, samplerLockSpace, s.lockKey)
	}
	_ = conn.Close(ctx)
}
