//go:build faults

package faults

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

const (
	// producerRate is the producers' combined rate, in events per second,
	// each event committed in a transaction of its own.
	producerRate = 2000
	producers    = 8
	// relayDown is how long the relay stays down while producers write.
	relayDown = time.Minute
)

// Scenario 9: producers write at a steady 2,000 events/s, one event per
// transaction, while no relay runs for a minute; then the relay starts and
// drains the backlog while they go on. No producer transaction fails, and
// none ever waits on a lock a relay session holds (the relay's claims take
// row locks with SKIP LOCKED on rows producers never touch again, and the
// trigger only tries the gate's lock). Their commit latency before and
// after the relay starts is reported.
func TestRelayDownUnderProducerLoad(t *testing.T) {
	w := newWorld(t)
	r := rng(t)
	o := outcome{Scenario: "9 relay down for a minute under producer load"}
	cfg, err := pgxpool.ParseConfig(w.url)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = "faults-producer"
	cfg.MaxConns = producers
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	defer pool.Close()

	for run := range 2 {
		tag := fmt.Sprintf("backlog-%d", run)
		load := startProducers(pool, tag)
		down := relayDown + time.Duration(r.Int64N(int64(5*time.Second)))
		<-time.After(down) // the relay's downtime
		backlog := load.committed()
		load.phase()
		watch := watchProducerLocks(t, w)
		p := w.relay()
		started := time.Now()
		w.count.waitDistinct(t, tag, backlog, 5*time.Minute)
		caughtUp := time.Since(started)
		load.phase()
		<-time.After(5 * time.Second) // the producers go on, the relay keeping pace
		total := load.stop()
		waits, blockedByRelay := watch()
		w.settle(&o, tag, total, faultEnd{at: started, committed: backlog})
		o.Faults++
		p.Stop(time.Minute)

		down0, draining, steady := load.phases[0], load.phases[1], load.phases[2]
		t.Logf("%s: relay down %s, backlog %d events, caught up %s after the relay started",
			tag, down.Round(time.Millisecond), backlog, caughtUp.Round(time.Millisecond))
		t.Logf("%s: producers with the relay down: %s; while it drained: %s; once it kept pace: %s", tag, down0, draining, steady)
		t.Logf("%s: producer lock waits sampled while the relay ran, by lock: %v; behind a relay session: %v", tag, waits, blockedByRelay)
		o.Notes = append(o.Notes, fmt.Sprintf("run %d: backlog of %d events after %s down, caught up %s after the relay started. "+
			"Producer commits with the relay down: %s; while it drained: %s; once it kept pace: %s. "+
			"Producer lock waits sampled every 10 ms while the relay ran, by lock: %v; behind a relay session: %v; producer errors: %d",
			run, backlog, down.Round(time.Second), caughtUp.Round(time.Millisecond), down0, draining, steady, waits, blockedByRelay, load.errors.Load()))
		require.Zero(t, load.errors.Load(), "producer transactions failed")
		// A relation extension lock is taken by whoever adds a page to the
		// table, producer or relay (an UPDATE writes a new row version), for
		// the time it takes to add the page, not to the end of a
		// transaction. Any other lock a producer waits for behind the relay
		// would be the relay's doing.
		delete(blockedByRelay, "extend")
		require.Empty(t, blockedByRelay, "a producer waited on a lock held by a relay transaction")
	}
	record(o)
	require.Zero(t, o.Lost)
}

// load is a set of producers committing one event per transaction at
// producerRate in all, with per-phase commit latencies.
type load struct {
	sent   atomic.Int64
	errors atomic.Int64
	stopC  chan struct{}
	wg     sync.WaitGroup

	mu     sync.Mutex
	phases []*phase
}

// phase is the producers' record over one stretch of time.
type phase struct {
	start, end time.Time
	latencies  []time.Duration
}

func (p *phase) String() string {
	if len(p.latencies) == 0 {
		return "no commits"
	}
	l := slices.Clone(p.latencies)
	slices.Sort(l)
	at := func(q float64) time.Duration {
		return l[min(len(l)-1, int(q*float64(len(l))))].Round(10 * time.Microsecond)
	}
	rate := float64(len(l)) / p.end.Sub(p.start).Seconds()
	return fmt.Sprintf("%.0f commits/s, p50 %s, p99 %s, max %s", rate, at(0.5), at(0.99), l[len(l)-1].Round(10*time.Microsecond))
}

func startProducers(pool *pgxpool.Pool, tag string) *load {
	l := &load{stopC: make(chan struct{}), phases: []*phase{{start: time.Now()}}}
	interval := time.Second * producers / producerRate
	for range producers {
		l.wg.Go(func() {
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for {
				select {
				case <-l.stopC:
					return
				case <-tick.C:
				}
				n := l.sent.Add(1)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				begin := time.Now()
				_, err := pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
					VALUES ('order', $1, $2, jsonb_build_object('n', $3::bigint))`, fmt.Sprint(n%97), tag, n)
				took := time.Since(begin)
				cancel()
				if err != nil {
					l.sent.Add(-1) // not committed
					l.errors.Add(1)
					continue
				}
				l.mu.Lock()
				cur := l.phases[len(l.phases)-1]
				cur.latencies = append(cur.latencies, took)
				l.mu.Unlock()
			}
		})
	}
	return l
}

// committed is how many events the producers have committed so far (or
// are committing this instant).
func (l *load) committed() int { return int(l.sent.Load()) }

// phase starts a new phase.
func (l *load) phase() {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	l.phases[len(l.phases)-1].end = now
	l.phases = append(l.phases, &phase{start: now})
}

// stop stops the producers and returns how many events they committed.
func (l *load) stop() int {
	close(l.stopC)
	l.wg.Wait()
	l.mu.Lock()
	l.phases[len(l.phases)-1].end = time.Now()
	l.mu.Unlock()
	return l.committed()
}

// watchProducerLocks samples, every 10 ms until the returned function is
// called, the producers' sessions waiting on a heavyweight lock, by the
// kind of lock (pg_stat_activity.wait_event), and counts those that wait
// behind a relay session.
func watchProducerLocks(t *testing.T, w *world) (stop func() (waits, behindRelay map[string]int)) {
	t.Helper()
	done := make(chan struct{})
	waits, behindRelay := map[string]int{}, map[string]int{}
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			rows, err := w.pool.Query(context.Background(), `
				SELECT a.wait_event, count(*),
				       count(*) FILTER (WHERE EXISTS (
				           SELECT 1 FROM pg_stat_activity r
				           WHERE r.pid = ANY (pg_blocking_pids(a.pid)) AND r.application_name LIKE 'outboxrelay%'))
				FROM pg_stat_activity a
				WHERE a.datname = current_database() AND a.application_name = 'faults-producer'
				  AND a.wait_event_type = 'Lock'
				GROUP BY a.wait_event`)
			if err == nil {
				var (
					event    string
					n, relay int
				)
				_, err = pgx.ForEachRow(rows, []any{&event, &n, &relay}, func() error {
					waits[event] += n
					if relay > 0 {
						behindRelay[event] += relay
					}
					return nil
				})
			}
			if err != nil {
				t.Errorf("sample producer locks: %v", err)
				return
			}
		}
	})
	return func() (map[string]int, map[string]int) {
		close(done)
		wg.Wait()
		return waits, behindRelay
	}
}
