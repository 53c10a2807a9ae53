//go:build faults

package faults

import (
	"bytes"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
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

// restartPostgres stops the local cluster (fast shutdown: every session is
// terminated) and starts it again, and returns when it accepted connections
// again, with a function that waits for pg_ctlcluster start, which returns
// up to 2 s after that (readiness is polled while it runs).
func restartPostgres(t *testing.T) (ready time.Time, wait func()) {
	t.Helper()
	versions, err := os.ReadDir("/etc/postgresql")
	require.NoError(t, err, "PostgreSQL restarts need a local cluster managed by pg_ctlcluster")
	require.NotEmpty(t, versions)
	ctl := func(action string) *exec.Cmd {
		return exec.Command("pg_ctlcluster", "--skip-systemctl-redirect", versions[0].Name(), "main", action)
	}
	out, err := ctl("stop").CombinedOutput()
	require.NoError(t, err, string(out))
	var startOut bytes.Buffer
	start := ctl("start")
	start.Stdout, start.Stderr = &startOut, &startOut
	require.NoError(t, start.Start())
	testkit.WaitFor(t, time.Minute, "PostgreSQL to accept connections", func() bool {
		return exec.Command("pg_isready", "-q", "-h", "127.0.0.1", "-p", "5432").Run() == nil
	})
	return time.Now(), func() {
		t.Helper()
		require.NoError(t, start.Wait(), startOut.String())
	}
}

// Scenario 6: while 30,000 events stream in at 5,000/s, every PostgreSQL
// connection of the relay is terminated at four random points, then
// PostgreSQL itself is restarted at a fifth. Twice.
func TestPostgresConnectionsTerminatedAndRestarted(t *testing.T) {
	w := newWorld(t)
	r := rng(t)
	o := outcome{Scenario: "6 relay's PostgreSQL connections terminated, PostgreSQL restarted"}
	const events = 30000
	for run := range 2 {
		tag := fmt.Sprintf("pg-%d", run)
		p := w.relay(crashArgs...)
		wait := w.stream(tag, events)
		points := faultPoints(r, 5, 1000, events-5000)
		var last faultEnd
		for i, at := range points {
			w.waitPublished(tag, at, 2*time.Minute)
			if i == len(points)-1 {
				begin := time.Now()
				ready, started := restartPostgres(t)
				last = w.ended(tag)
				last.at = ready
				started()
				t.Logf("%s: PostgreSQL restarted after %d events published, down for %s", tag, at, ready.Sub(begin).Round(time.Millisecond))
			} else {
				n := testkit.QueryInt(t, w.pool, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
					WHERE datname = current_database() AND application_name LIKE 'outboxrelay%'`)
				t.Logf("%s: terminated %d relay backends after %d events published", tag, n, at)
				last = w.ended(tag)
			}
			o.Faults++
		}
		wait()
		w.settle(&o, tag, events, last)
		p.Stop(time.Minute)
		require.NotContains(t, strings.ToLower(p.Out.String()), "panic")
	}
	record(o)
	require.Zero(t, o.Lost)
}

// Scenario 6b: the relay's every connection to PostgreSQL (its pool and
// its listener, through a TCP proxy) goes silent for 10 s mid-stream: no
// error, no close, so only the relay's statement timeouts and the
// listener's heartbeat can notice. Producers write straight to the
// database all along. Twice.
func TestPostgresSilentPartition(t *testing.T) {
	outage{
		scenario: "6b PostgreSQL behind a silent partition for 10 s", name: "pg-partition", duration: tenSeconds,
		setup: func(t *testing.T, w *world) (string, string, func(), func()) {
			u, err := url.Parse(w.url)
			require.NoError(t, err)
			proxy := testkit.NewProxy(t, u.Host)
			u.Host = proxy.Addr()
			return u.String(), testkit.AMQPURL(), proxy.Blackhole, proxy.Heal
		},
	}.play(t)
}
