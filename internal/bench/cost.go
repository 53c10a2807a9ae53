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
	// database meters every client backend of the database but the
	// benchmark's own instead of the child's (see
	// database.databaseBackends).
	database bool
	child    time.Duration
	pg       map[int]time.Duration
	wal      int64
	counted  counters
}

// beginCost takes the starting sample. A relay whose metrics endpoint does
// not answer yet has just started: it has made no claim.
func beginCost(ctx context.Context, db *database, sys *system) (*costMeter, error) {
	m := &costMeter{db: db, proc: sys.proc, app: sys.app, metrics: sys.metrics}
	if m.metrics != "" {
		m.counted, _ = scrape(ctx, m.metrics)
	}
	if err := m.start(ctx); err != nil {
		return nil, err
	}
	return m, nil
}

// beginDatabaseCost is beginCost for a relay that serves its metrics
// already (one warmed up), metering every client backend of the database
// but the benchmark's own instead of the relay's alone: the horizon
// workload's, whose figures count the producers' backends too.
func beginDatabaseCost(ctx context.Context, db *database, sys *system) (*costMeter, error) {
	m := &costMeter{db: db, proc: sys.proc, app: sys.app, metrics: sys.metrics, database: true}
	if m.metrics != "" {
		c, err := scrapeOnceUp(ctx, m.metrics)
		if err != nil {
			return nil, fmt.Errorf("cost: %w", err)
		}
		m.counted = c
	}
	if err := m.start(ctx); err != nil {
		return nil, err
	}
	return m, nil
}

// start samples the child's CPU, its backends' and the WAL position.
func (m *costMeter) start(ctx context.Context) error {
	st, err := readProcStat(m.proc.pid())
	if err != nil {
		return fmt.Errorf("cost: %w", err)
	}
	m.child = st.cpu
	if m.pg, _, err = m.backends(ctx); err != nil {
		return fmt.Errorf("cost: %w", err)
	}
	if m.wal, err = m.db.walWritten(ctx); err != nil {
		return fmt.Errorf("cost: %w", err)
	}
	return nil
}

// backends samples the CPU of the child's backends. It reports false when
// some backend's /proc entry is not a PostgreSQL process of this machine:
// the database runs elsewhere and its CPU cannot be read.
func (m *costMeter) backends(ctx context.Context) (map[int]time.Duration, bool, error) {
	var pids []int
	var err error
	if m.database {
		pids, err = m.db.databaseBackends(ctx)
	} else {
		pids, err = m.db.backends(ctx, m.app)
	}
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

// costEnd is the closing sample of a costMeter.
type costEnd struct {
	child   time.Duration
	peak    int64
	pg      map[int]time.Duration
	known   bool // the backends' CPU could be read
	wal     int64
	counted counters // read where the meter has a metrics endpoint
}

// finish takes the closing sample while the child still runs and divides
// by the events it delivered. Nil if it delivered none.
func (m *costMeter) finish(ctx context.Context, events int64) (*Cost, error) {
	end, err := m.end(ctx)
	if err != nil {
		return nil, err
	}
	return m.cost(end, events), nil
}

// end takes the closing sample while the child still runs.
func (m *costMeter) end(ctx context.Context) (costEnd, error) {
	st, err := readProcStat(m.proc.pid())
	if err != nil {
		return costEnd{}, fmt.Errorf("cost: %w", err)
	}
	e := costEnd{child: st.cpu}
	if e.peak, err = readPeakRSS(m.proc.pid()); err != nil {
		return costEnd{}, fmt.Errorf("cost: %w", err)
	}
	if e.pg, e.known, err = m.backends(ctx); err != nil {
		return costEnd{}, fmt.Errorf("cost: %w", err)
	}
	if e.wal, err = m.db.walWritten(ctx); err != nil {
		return costEnd{}, fmt.Errorf("cost: %w", err)
	}
	if m.metrics != "" {
		if e.counted, err = scrapeOnceUp(ctx, m.metrics); err != nil {
			return costEnd{}, fmt.Errorf("cost: %w", err)
		}
	}
	return e, nil
}

// cost is what was spent from the meter's start to e, divided by the
// events delivered meanwhile. Nil if none were.
func (m *costMeter) cost(e costEnd, events int64) *Cost {
	if events <= 0 {
		return nil
	}
	per1k := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) * 1000 / float64(events) }
	c := &Cost{RelayCPUPer1k: per1k(e.child - m.child), PeakRSSMiB: float64(e.peak) / (1 << 20),
		WALPerEvent: float64(e.wal-m.wal) / float64(events)}
	if m.metrics != "" {
		n := e.counted
		c.ClaimsPer1k = ptr((n.claims - m.counted.claims) * 1000 / float64(events))
		c.GateCloses = ptr(n.gateCloses - m.counted.gateCloses)
		c.AllocsPerEvent = ptr((n.mallocs - m.counted.mallocs) / float64(events))
	}
	c.TotalPer1k = c.RelayCPUPer1k
	if e.known {
		var spent time.Duration
		for pid, end := range e.pg {
			spent += end - m.pg[pid]
		}
		c.PGCPUPer1k = ptr(per1k(spent))
		c.TotalPer1k += *c.PGCPUPer1k
	}
	return c
}
