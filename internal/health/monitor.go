package health

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/outboxrelay/outboxrelay/internal/pace"
)

// Check is one readiness condition.
type Check struct {
	// Name names the check in /readyz's answer.
	Name string
	// Run returns nil while the condition holds. It is given Timeout.
	Run func(ctx context.Context) error
	// Every, if longer than the monitor's Interval, runs the check only
	// that often (a costlier check); its last result stands between runs.
	// Default 0: every round.
	Every time.Duration
}

// Config configures a Monitor.
type Config struct {
	// Checks are run in order at every interval. Required.
	Checks []Check
	// Interval is how often the checks run. Default 1s.
	Interval time.Duration
	// Timeout bounds one check. Default 2s.
	Timeout time.Duration
	// OnResult, if set, is called after each check with its result
	// (metrics). Default nil.
	OnResult func(name string, err error)
	// OnReady, if set, is called after each round with whether every check
	// passed. Default nil.
	OnReady func(ready bool)
	// Logger receives a line when readiness changes. Default: discarded.
	Logger *slog.Logger
}

// Monitor runs the readiness checks. Create it with New, drive it with Run.
type Monitor struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	failing map[string]string // check name → why it fails
	checked bool              // a round has completed

	// Owned by Run: when it started, whether the relay was ever ready,
	// whether not being ready was logged at Warn.
	started    time.Time
	everReady  bool
	warnedSlow bool
	lastRun    map[string]time.Time // when each check last ran
	lastErr    map[string]error     // and what it returned
}

// startGrace is how long a relay that has never been ready may take to
// connect before "not ready" is a warning: at start the listener and the
// broker connect while the first checks run.
const startGrace = 15 * time.Second

// New checks cfg and returns a Monitor that is not ready until its first
// round of checks has passed.
func New(cfg Config) (*Monitor, error) {
	if len(cfg.Checks) == 0 {
		return nil, fmt.Errorf("health: Config.Checks: at least one check is required")
	}
	for i, c := range cfg.Checks {
		if c.Name == "" || c.Run == nil {
			return nil, fmt.Errorf("health: Config.Checks[%d]: Name and Run are required", i)
		}
	}
	if cfg.Interval < 0 || cfg.Timeout < 0 {
		return nil, fmt.Errorf("health: Config.Interval and Timeout must not be negative")
	}
	cfg.Interval = cmp.Or(cfg.Interval, time.Second)
	cfg.Timeout = cmp.Or(cfg.Timeout, 2*time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Monitor{cfg: cfg, log: cfg.Logger.With("component", "health"),
		lastRun: map[string]time.Time{}, lastErr: map[string]error{}}, nil
}

// Run checks at once and then at every multiple of Interval on the wall
// clock until ctx ends; it returns
// nil then. ctx is the relay's: when it ends the relay is shutting down,
// stopping the very parts the checks look at, so the monitor stops
// checking and answers not ready, "shutting down", without a warning.
func (m *Monitor) Run(ctx context.Context) error {
	m.started = time.Now()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			m.mu.Lock()
			m.failing, m.checked = map[string]string{"relay": "shutting down"}, true
			m.mu.Unlock()
			if m.cfg.OnReady != nil {
				m.cfg.OnReady(false)
			}
			return nil
		case <-t.C:
		}
		m.round(ctx)
		// On the wall clock's multiples of Interval, with the relay's
		// other loops of the same pace: one wake-up for all of them.
		t.Reset(time.Until(pace.Next(time.Now(), m.cfg.Interval)))
	}
}

func (m *Monitor) round(ctx context.Context) {
	failing := map[string]string{}
	for _, c := range m.cfg.Checks {
		err, ran := m.lastErr[c.Name], m.lastRun[c.Name]
		// A failing check runs every round, so recovery shows at once.
		if err != nil || ran.IsZero() || time.Since(ran) >= c.Every {
			cctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
			err = c.Run(cctx)
			cancel()
			if ctx.Err() != nil {
				return
			}
			m.lastRun[c.Name], m.lastErr[c.Name] = time.Now(), err
		}
		if err != nil {
			failing[c.Name] = err.Error()
		}
		if m.cfg.OnResult != nil {
			m.cfg.OnResult(c.Name, err)
		}
	}
	m.mu.Lock()
	wasReady := m.checked && len(m.failing) == 0
	m.failing, m.checked = failing, true
	m.mu.Unlock()
	ready := len(failing) == 0
	if m.cfg.OnReady != nil {
		m.cfg.OnReady(ready)
	}
	switch {
	case ready && !wasReady:
		m.log.Info("ready")
		m.everReady, m.warnedSlow = true, false
	case !ready && wasReady:
		m.log.Warn("not ready", "failing", failing)
	case !ready && !m.everReady && !m.warnedSlow && time.Since(m.started) >= startGrace:
		m.log.Warn("not ready since start", "failing", failing, "after", startGrace)
		m.warnedSlow = true
	case !ready && !m.everReady && !m.warnedSlow:
		m.log.Debug("not ready yet", "failing", failing)
	}
}

// Status is /readyz's answer.
type Status struct {
	Ready bool `json:"ready"`
	// Failing maps each failing check to why it fails.
	Failing map[string]string `json:"failing,omitempty"`
	// Reason sums the failures up in one line.
	Reason string `json:"reason,omitempty"`
}

// Status returns the result of the last round of checks.
func (m *Monitor) Status() Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.checked {
		return Status{Reason: "starting: not checked yet"}
	}
	if len(m.failing) == 0 {
		return Status{Ready: true}
	}
	names := make([]string, 0, len(m.failing))
	for name := range m.failing {
		names = append(names, name)
	}
	slices.Sort(names)
	reason := ""
	for i, name := range names {
		if i > 0 {
			reason += "; "
		}
		reason += name + ": " + m.failing[name]
	}
	return Status{Failing: maps.Clone(m.failing), Reason: reason}
}
