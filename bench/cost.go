package bench

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"
)

// costMeter measures the CPU a child process and its PostgreSQL backends
// (found by the child's unique application_name) spend between begin and
// finish, the child's peak memory, the WAL the server wrote meanwhile and,
// for a relay, the claims it made, the times it closed its notification
// gate and its heap allocations. A backend first seen at finish counts
// from 0; one gone by then is not counted.
type costMeter struct {
	db      *database
	proc    *process
	app     string
	metrics string
	child   time.Duration
	pg      map[int]time.Duration
	wal     int64
	counted counters
}

// beginCost takes the starting sample. A relay whose metrics endpoint does
// not answer yet has just started: it has made no claim.
func beginCost(ctx context.Context, db *database, sys *system) (*costMeter, error) {
	m := &costMeter{db: db, proc: sys.proc, app: sys.app, metrics: sys.metrics}
	if m.metrics != "" {
		m.counted, _ = scrape(ctx, m.metrics)
	}
	st, err := readProcStat(m.proc.pid())
	if err != nil {
		return nil, fmt.Errorf("cost: %w", err)
	}
	m.child = st.cpu
	if m.pg, _, err = m.backends(ctx); err != nil {
		return nil, fmt.Errorf("cost: %w", err)
	}
	if m.wal, err = m.db.walWritten(ctx); err != nil {
		return nil, fmt.Errorf("cost: %w", err)
	}
	return m, nil
}

// backends samples the CPU of the child's backends. It reports false when
// some backend's /proc entry is not a PostgreSQL process of this machine:
// the database runs elsewhere and its CPU cannot be read.
func (m *costMeter) backends(ctx context.Context) (map[int]time.Duration, bool, error) {
	pids, err := m.db.backends(ctx, m.app)
	if err != nil {
		return nil, false, err
	}
	cpu := make(map[int]time.Duration, len(pids))
	foreign := false
	for _, pid := range pids {
		st, err := readProcStat(pid)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue // exited meanwhile, or in another PID namespace
		case err != nil || !strings.HasPrefix(st.comm, "postgres"):
			foreign = true
			continue
		}
		cpu[pid] = st.cpu
	}
	return cpu, len(cpu) > 0 && !foreign, nil
}

// finish takes the closing sample while the child still runs and divides
// by the events it delivered. Nil if it delivered none.
func (m *costMeter) finish(ctx context.Context, events int64) (*Cost, error) {
	st, err := readProcStat(m.proc.pid())
	if err != nil {
		return nil, fmt.Errorf("cost: %w", err)
	}
	peak, err := readPeakRSS(m.proc.pid())
	if err != nil {
		return nil, fmt.Errorf("cost: %w", err)
	}
	pg, known, err := m.backends(ctx)
	if err != nil {
		return nil, fmt.Errorf("cost: %w", err)
	}
	wal, err := m.db.walWritten(ctx)
	if err != nil {
		return nil, fmt.Errorf("cost: %w", err)
	}
	if events <= 0 {
		return nil, nil
	}
	per1k := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) * 1000 / float64(events) }
	c := &Cost{RelayCPUPer1k: per1k(st.cpu - m.child), PeakRSSMiB: float64(peak) / (1 << 20),
		WALPerEvent: float64(wal-m.wal) / float64(events)}
	if m.metrics != "" {
		n, err := scrapeOnceUp(ctx, m.metrics)
		if err != nil {
			return nil, fmt.Errorf("cost: %w", err)
		}
		c.ClaimsPer1k = ptr((n.claims - m.counted.claims) * 1000 / float64(events))
		c.GateCloses = ptr(n.gateCloses - m.counted.gateCloses)
		c.AllocsPerEvent = ptr((n.mallocs - m.counted.mallocs) / float64(events))
	}
	c.TotalPer1k = c.RelayCPUPer1k
	if known {
		var spent time.Duration
		for pid, end := range pg {
			spent += end - m.pg[pid]
		}
		c.PGCPUPer1k = ptr(per1k(spent))
		c.TotalPer1k += *c.PGCPUPer1k
	}
	return c, nil
}
