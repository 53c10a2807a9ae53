//go:build faults

package faults

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// Scenario 10: a backlog of 300 events of 1 MiB each (300 MiB; stored
// compressed in a few MB, so only the text the relay receives is large).
// The relay's memory is bounded by what it has in flight, --workers times
// --max-batch-bytes (4 × 16 MiB by default), never by the backlog: batches
// of 500 such events would hold it all.
func TestLargeEventBacklogKeepsMemoryBounded(t *testing.T) {
	w := newWorld(t)
	r := rng(t)
	o := outcome{Scenario: "10 backlog of 300 events of 1 MiB: bounded memory"}
	const (
		tag    = "large"
		events = 300
		// limit is the relay's peak resident memory allowed: three times
		// the 64 MiB that may be in flight (the text read from PostgreSQL
		// and the message body are both held for a while, and the garbage
		// collector lets the heap grow to twice what is live). Measured: 63
		// MiB; with no byte budget (--max-batch-bytes=1000000000) 363 MiB,
		// and growing with the backlog.
		limit = 192 << 20
	)
	testkit.Exec(t, w.pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', i::text, $1, jsonb_build_object('n', i, 'blob', repeat(chr(97 + i % 26), $2))
		FROM generate_series(1, $3) AS i`, tag, 1<<20+r.IntN(1024), events)
	started := w.ended(tag)
	p := w.relay("--poll-interval=500ms")
	w.settle(&o, tag, events, started)
	o.Faults++
	peak := peakRSS(t, p.Pid())
	p.Stop(time.Minute)
	t.Logf("relay peak resident memory: %d MiB draining %d MiB", peak>>20, events)
	o.Notes = append(o.Notes, fmt.Sprintf("relay peak resident memory (VmHWM) %d MiB while draining 300 MiB with --workers 4 and --max-batch-bytes 16 MiB", peak>>20))
	record(o)
	require.Zero(t, o.Lost)
	require.Less(t, peak, int64(limit), "the relay's memory grew with the backlog")
}

// peakRSS is a process's peak resident set size (VmHWM), in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	require.NoError(t, s.Err())
	t.Fatal("no VmHWM in /proc/<pid>/status")
	return 0
}
