//go:build faults

package faults

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/testkit"
)

// faultPoints returns n distinct delivery counts in [lo, hi), ascending:
// where a drain's faults strike.
func faultPoints(r interface{ IntN(int) int }, n, lo, hi int) []int {
	points := make([]int, 0, n)
	for len(points) < n {
		p := lo + r.IntN(hi-lo)
		if !slices.Contains(points, p) {
			points = append(points, p)
		}
	}
	slices.Sort(points)
	return points
}

// restartPostgres restarts the local cluster (fast shutdown) and waits
// until it accepts connections again.
func restartPostgres(t *testing.T) {
	t.Helper()
	versions, err := os.ReadDir("/etc/postgresql")
	require.NoError(t, err, "PostgreSQL restarts need a local cluster managed by pg_ctlcluster")
	require.NotEmpty(t, versions)
	out, err := exec.Command("pg_ctlcluster", "--skip-systemctl-redirect", versions[0].Name(), "main", "restart").CombinedOutput()
	require.NoError(t, err, string(out))
	testkit.WaitFor(t, time.Minute, "PostgreSQL to accept connections", func() bool {
		return exec.Command("pg_isready", "-q", "-h", "127.0.0.1", "-p", "5432").Run() == nil
	})
}

// Scenario 6: while 30,000 events stream in at 5,000/s, every PostgreSQL
// connection of the relay is terminated at five random points, then
// PostgreSQL itself is restarted.
func TestPostgresConnectionsTerminatedAndRestarted(t *testing.T) {
	w := newWorld(t)
	r := rng(t)
	o := outcome{Scenario: "6 relay's PostgreSQL connections terminated, PostgreSQL restarted"}
	const (
		tag    = "pg"
		events = 30000
	)
	p := w.relay(crashArgs...)
	wait := w.stream(tag, events)
	points := faultPoints(r, 6, 1000, events-5000)
	var last time.Time
	for i, at := range points {
		w.count.waitDistinct(t, tag, at, 2*time.Minute)
		last = time.Now()
		if i == len(points)-1 {
			restartPostgres(t)
			t.Logf("PostgreSQL restarted after %d deliveries", at)
		} else {
			n := testkit.QueryInt(t, w.pool, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE datname = current_database() AND application_name LIKE 'outboxrelay%'`)
			t.Logf("terminated %d relay backends after %d deliveries", n, at)
		}
		o.Runs++
	}
	wait()
	runs := o.Runs
	w.settle(&o, tag, events, last)
	o.Runs = runs
	p.Stop(time.Minute)
	require.NotContains(t, strings.ToLower(p.Out.String()), "panic")
	record(o)
	require.Zero(t, o.Lost)
}
