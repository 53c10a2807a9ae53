package main_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/bench"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// TestBenchRunsAtTinySize runs the whole benchmark at a size that proves
// every workload (the ordered one too) and the report work, asserting
// correctness, never speed.
func TestBenchRunsAtTinySize(t *testing.T) {
	t.Parallel()
	dbURL := testkit.NewDatabase(t)
	schema := testkit.UniqueName("bench")
	exchange := testkit.UniqueName("outboxrelay_bench")
	jsonPath := filepath.Join(t.TempDir(), "bench.jsonl")

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary,
		"--database-url="+dbURL, "--amqp-url="+testkit.AMQPURL(),
		"--schema="+schema, "--exchange="+exchange, "--json="+jsonPath,
		"--drain-events=300", "--naive-drain-time=1s",
		"--steady-rates=200", "--steady-duration=1s", "--producers=2",
		"--idle-events=5", "--idle-interval=20ms",
		"--producer-concurrency=1,2", "--producer-duration=500ms", "--producer-pairs=2",
		"--ordered-shapes=20x5,50x1,1x40",
		"--ordered-steady-rate=200", "--ordered-steady-aggregates=10",
		"--scale-relays=1,2", "--scheduled-events=200", "--scheduled-over=2s", "--early-ids-rate=200", "--early-ids-duration=2s",
		"--burst-pairs=1", "--burst-rest=300ms", "--burst-duration=1500ms", "--burst-producers=2",
		"--step-rates=100,300", "--step-duration=1s", "--drain-wait=30s")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 45 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	t.Logf("bench output:\n%s", stdout.String())

	require.Contains(t, stdout.String(), "workload")
	require.Contains(t, stdout.String(), "cpu ms/1k (relay+pg)")
	require.Contains(t, stdout.String(), "claims/1k")
	require.Contains(t, stdout.String(), "wal B/event")
	require.Contains(t, stdout.String(), "gate closes")
	require.Contains(t, stdout.String(), "allocs/event")
	require.Contains(t, stdout.String(), "ratios")
	require.Contains(t, stdout.String(), "drain relay/ceiling")
	require.Contains(t, stdout.String(), "idle p50 relay − ceiling")
	require.Contains(t, stdout.String(), "steady 200/s p50 / p99 / p99.9 relay − ceiling")
	require.Contains(t, stdout.String(), "steps #2 300/s p50 / p99 / p99.9 relay − ceiling")
	require.Contains(t, stdout.String(), "producer c=2 with/without trigger")
	require.Contains(t, stdout.String(), "out of order")
	require.Contains(t, stdout.String(), "producer c=2 with/without ordering index")
	require.Contains(t, stdout.String(), "ordered 20x5 keyscan/relay")
	require.Contains(t, stdout.String(), "bursts triggered/resting relay, first second")
	require.Contains(t, stdout.String(), "bursts triggered/polling relay, first second")
	require.Contains(t, stdout.String(), "p99.9")

	rows, machines, ratios := readBenchJSON(t, jsonPath)
	require.Equal(t, 1, machines)
	require.Equal(t, 1, ratios)
	counts := map[[2]string]int{}
	byRow := map[[2]string]bench.Result{}
	for _, r := range rows {
		key := [2]string{r.Workload, r.System}
		counts[key]++
		byRow[key] = r
	}
	require.Equal(t, map[[2]string]int{
		{"drain", "relay"}: 1, {"drain", "naive"}: 1, {"drain", "ceiling"}: 1,
		{"steady", "relay"}: 1, {"steady", "naive"}: 1, {"steady", "ceiling"}: 1,
		{"idle", "relay"}: 1, {"idle", "naive"}: 1, {"idle", "ceiling"}: 1,
		{"producer", "relay"}: 8, {"producer", "keyscan"}: 4,
		{"ordered", "relay"}: 4, {"ordered", "keyscan"}: 4,
		{"scale", "relay"}:     2,
		{"scheduled", "relay"}: 1,
		{"early-ids", "relay"}: 1,
		{"bursts", "relay"}:    3,
		{"steps", "relay"}:     2, {"steps", "ceiling"}: 2,
	}, counts)

	for _, r := range rows {
		if r.Workload != "bursts" {
			continue
		}
		require.NotNil(t, r.FirstSecondRate, "bursts: no first-second rate")
		require.Positive(t, *r.FirstSecondRate, "bursts: nothing committed in the first second")
		require.NotNil(t, r.Lost)
		require.Zero(t, *r.Lost, "bursts: events lost")
		require.Equal(t, *r.Trigger, r.Latency != nil, "bursts: latency is reported with the triggers, and only then")
		require.Equal(t, *r.Trigger, r.BurstArm == bench.BurstTriggered, "bursts: arm %s", r.BurstArm)
	}
	for _, r := range rows {
		if r.Workload != "steps" {
			continue
		}
		require.Contains(t, []int{100, 300}, r.TargetRate)
		require.Positive(t, r.Committed, "steps: nothing committed in step %d", r.Step)
		require.NotNil(t, r.Latency, "steps: no latency in step %d", r.Step)
		require.NotNil(t, r.Lost)
		require.Zero(t, *r.Lost, "steps: events lost in step %d", r.Step)
	}

	early := byRow[[2]string{"early-ids", "relay"}]
	require.NotNil(t, early.Lost)
	require.Zero(t, *early.Lost, "early-ids: events whose ids were handed out before their insert, lost")
	require.Equal(t, early.Committed, early.Events, "early-ids: every committed event arrived")

	drain := byRow[[2]string{"drain", "relay"}]
	require.NotNil(t, drain.Lost)
	require.Zero(t, *drain.Lost, "drain lost events")
	require.Zero(t, drain.Duplicates, "drain duplicates")
	require.EqualValues(t, 300, drain.Events)
	require.Positive(t, drain.Rate)
	require.NotNil(t, drain.Cost)
	// At least a claim's and a mark's WAL records per event, whatever else
	// the suite's other tests write meanwhile.
	require.Greater(t, drain.Cost.WALPerEvent, 100.0, "drain WAL per event")
	// The relays' claims and gate closes come from their metrics; the
	// naive poller has none.
	for _, row := range [][2]string{{"drain", "relay"}, {"steady", "relay"}} {
		c := byRow[row].Cost
		require.NotNil(t, c, "%s %s", row[0], row[1])
		require.NotNil(t, c.ClaimsPer1k, "%s %s: claims not read", row[0], row[1])
		require.Positive(t, *c.ClaimsPer1k, "%s %s: claims", row[0], row[1])
		require.NotNil(t, c.GateCloses, "%s %s: gate closes not read", row[0], row[1])
		require.NotNil(t, c.AllocsPerEvent, "%s %s: allocations not read", row[0], row[1])
		// Each event's message and row at least, whatever a claim shares.
		require.Greater(t, *c.AllocsPerEvent, 1.0, "%s %s: allocations per event", row[0], row[1])
	}
	// A naive row is costed only when the poller delivered something in its
	// time (a slow machine may start it too late for its first poll); the
	// steady run delivers at its rate, so at least one naive row is costed.
	costed := 0
	for _, row := range [][2]string{{"drain", "naive"}, {"steady", "naive"}} {
		r := byRow[row]
		if r.Events == 0 {
			require.Nil(t, r.Cost, "%s %s delivered nothing", row[0], row[1])
			continue
		}
		costed++
		require.NotNil(t, r.Cost, "%s %s", row[0], row[1])
		require.Nil(t, r.Cost.ClaimsPer1k, "%s %s: the naive poller has no claims metric", row[0], row[1])
	}
	require.Positive(t, costed, "no naive row was costed")
	for _, row := range [][2]string{{"steady", "relay"}, {"steady", "ceiling"}, {"idle", "relay"}, {"idle", "ceiling"}} {
		w, r := row[0]+" "+row[1], byRow[row]
		require.NotNil(t, r.Lost, w)
		require.Zero(t, *r.Lost, w)
		require.Zero(t, r.Duplicates, w)
		require.Positive(t, r.Rate, w)
		require.NotNil(t, r.Latency, w)
		for _, v := range []float64{r.Latency.P50, r.Latency.P90, r.Latency.P99, r.Latency.Max} {
			require.Positive(t, v, "%s latency %+v", w, *r.Latency)
		}
	}
	for _, r := range rows {
		if r.Workload == "producer" {
			require.Positive(t, r.Rate, "producer c=%d trigger=%v", r.Concurrency, *r.Trigger)
			require.NotNil(t, r.OrderingIndex)
			require.Equal(t, r.System == "keyscan", *r.OrderingIndex, "producer c=%d %s", r.Concurrency, r.System)
			// Each run meters the relay while the producers insert.
			require.NotNil(t, r.Cost, "producer c=%d %s trigger=%v: cost", r.Concurrency, r.System, *r.Trigger)
			require.NotNil(t, r.Cost.GateCloses, "producer c=%d %s trigger=%v: gate closes", r.Concurrency, r.System, *r.Trigger)
		}
	}
	var relays []int
	for _, r := range rows {
		if r.Workload != "scale" {
			continue
		}
		relays = append(relays, r.Relays)
		require.NotNil(t, r.Lost, "scale %d", r.Relays)
		require.Zero(t, *r.Lost, "scale %d: lost events", r.Relays)
		require.Zero(t, r.Duplicates, "scale %d: duplicates", r.Relays)
		require.EqualValues(t, 300, r.Events, "scale %d", r.Relays)
		require.NotNil(t, r.Cost, "scale %d", r.Relays)
		require.NotNil(t, r.Cost.ClaimsPer1k, "scale %d: claims", r.Relays)
	}
	require.Equal(t, []int{1, 2}, relays)
	require.Contains(t, stdout.String(), "scale 2×")
	ordered := 0
	for _, r := range rows {
		if r.Workload != "ordered" {
			continue
		}
		ordered++
		what := fmt.Sprintf("ordered %s %dx%d %d/s", r.System, r.Aggregates, r.PerAggregate, r.TargetRate)
		require.NotNil(t, r.Lost, what)
		require.Zero(t, *r.Lost, what)
		require.Zero(t, r.Duplicates, what)
		require.Equal(t, r.Committed, r.Events, what)
		require.Positive(t, r.Rate, what)
		require.NotNil(t, r.OutOfOrder, what)
		if r.System != "relay" {
			require.Zero(t, *r.OutOfOrder, "%s: first arrivals out of order", what)
		}
		if r.TargetRate > 0 {
			require.Equal(t, 10, r.Aggregates, what)
			require.NotNil(t, r.Latency, what)
		} else {
			require.EqualValues(t, r.Aggregates*r.PerAggregate, r.Events, what)
		}
	}
	require.Equal(t, 8, ordered)

	// Scheduled events arrive, none before its time, with the relay's
	// fallback poll an hour away.
	sched := byRow[[2]string{"scheduled", "relay"}]
	require.EqualValues(t, 200, sched.Committed)
	require.EqualValues(t, 200, sched.Events, "scheduled events delivered")
	require.NotNil(t, sched.Lost)
	require.Zero(t, *sched.Lost, "scheduled events lost")
	require.NotNil(t, sched.Early)
	require.Zero(t, *sched.Early, "scheduled events that arrived before their time")
	require.NotNil(t, sched.Latency, "scheduled latency")
	require.Less(t, sched.Latency.Max, 5000.0, "a scheduled event arrived long after its time: the relay did not wake for it")
	require.Contains(t, stdout.String(), "scheduled 200 over 2s")

	pool := testkit.NewPool(t, dbURL)
	require.Zero(t, testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, schema), "schema dropped")
	require.True(t, exchangeGone(t, exchange), "exchange deleted")
}

// The horizon workload, at a tiny size: a row per window with its claim
// time, pending rows and dead tuples, the ratio of the last pinned window
// to the baseline, and dead tuples that pile up while the horizon is
// pinned. It runs only when named.
func TestBenchRunsHorizonAtTinySize(t *testing.T) {
	t.Parallel()
	dbURL := testkit.NewDatabase(t)
	jsonPath := filepath.Join(t.TempDir(), "bench.jsonl")

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary,
		"--database-url="+dbURL, "--amqp-url="+testkit.AMQPURL(),
		"--schema="+testkit.UniqueName("bench"), "--exchange="+testkit.UniqueName("outboxrelay_bench"),
		"--json="+jsonPath, "--only=horizon", "--producers=2", "--drain-wait=30s",
		"--horizon-rate=100", "--horizon-window=2s", "--horizon-before=1",
		"--horizon-pinned=5s", // three windows: rounded up to whole ones
		"--horizon-after=1", "--horizon-aggregates=10")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 45 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	require.NoError(t, err, "stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	t.Logf("bench output:\n%s", stdout.String())

	for _, want := range []string{
		"claim mean", "claim p99≤ (ms)", "pending", "dead tuples",
		"horizon before 1", "horizon pinned 1", "horizon pinned 3", "horizon after 1",
		"horizon pinned 3/before claim mean", "horizon pinned 3/before cpu/event", "horizon pinned 3/before lag p99",
		"horizon pending before 1 → pinned 3",
	} {
		require.Contains(t, stdout.String(), want)
	}
	require.NotContains(t, stdout.String(), "horizon pinned 4")

	rows, _, ratios := readBenchJSON(t, jsonPath)
	require.Equal(t, 1, ratios)
	var windows []string
	dead := map[string]int64{}
	var pinnedEvents int64 // delivered in the pinned windows but the last
	for _, r := range rows {
		require.Equal(t, "horizon", r.Workload)
		require.Equal(t, "relay", r.System)
		what := fmt.Sprintf("%s %d", r.Phase, r.Window)
		windows = append(windows, what)
		require.Equal(t, 100, r.TargetRate, what)
		require.Equal(t, 10, r.Aggregates, what)
		require.InDelta(t, 2, r.Seconds, 0.5, what)
		require.Positive(t, r.Events, what)
		require.Positive(t, r.Committed, what)
		require.NotNil(t, r.Lost, what)
		require.Zero(t, *r.Lost, "%s: lost events", what)
		require.Zero(t, r.Duplicates, what)
		require.NotNil(t, r.OutOfOrder, what)
		require.NotNil(t, r.Latency, what)
		require.Positive(t, r.Latency.P99, what)
		require.NotNil(t, r.Cost, what)
		require.NotNil(t, r.Cost.ClaimsPer1k, what)
		require.NotNil(t, r.Claim, "%s: claim time", what)
		require.Positive(t, r.Claim.Mean, what)
		require.NotNil(t, r.Claim.P99Bound, what)
		require.NotNil(t, r.Pending, what)
		require.NotNil(t, r.DeadTuples, what)
		dead[what] = *r.DeadTuples
		if r.Phase == "pinned" && r.Window < 3 {
			pinnedEvents += r.Events
		}
	}
	require.Equal(t, []string{"before 1", "pinned 1", "pinned 2", "pinned 3", "after 1"}, windows)
	// While the horizon is pinned, every version a relay's update leaves
	// behind stays: the dead tuples pile up, at least one per event the
	// relay published (the last window's may not have reached the
	// statistics yet).
	require.Greater(t, dead["pinned 3"], dead["pinned 1"], "dead tuples while pinned: %v", dead)
	require.GreaterOrEqual(t, dead["pinned 3"], pinnedEvents, "dead tuples while pinned: %v", dead)

	h := readBenchRatios(t, jsonPath).Horizon
	require.NotNil(t, h)
	require.Equal(t, 1, h.Before)
	require.Equal(t, 3, h.Window)
	for name, c := range map[string]*bench.Comparison{"claim mean": h.ClaimMeanMS, "cpu per 1k": h.CPUPer1k, "lag p99": h.LagP99MS} {
		require.NotNil(t, c, name)
		require.NotNil(t, c.X, name)
		require.Positive(t, *c.X, name)
	}
	require.NotNil(t, h.PendingBefore)
	require.NotNil(t, h.PendingPinned)
}

// readBenchRatios parses the ratios line of one bench run.
func readBenchRatios(t *testing.T, path string) bench.Ratios {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var l struct {
			Ratios *bench.Ratios `json:"ratios"`
		}
		require.NoError(t, json.Unmarshal(line, &l), "%s", line)
		if l.Ratios != nil {
			return *l.Ratios
		}
	}
	t.Fatalf("no ratios line in %s", path)
	return bench.Ratios{}
}

// A run that profiles the relay gives it --http-addr through --relay-arg;
// the claims, the gate's closes and the allocations are then read there.
func TestBenchReadsTheMetricsWhereRelayArgsServeThem(t *testing.T) {
	t.Parallel()
	dbURL := testkit.NewDatabase(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	jsonPath := filepath.Join(t.TempDir(), "bench.jsonl")

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary,
		"--database-url="+dbURL, "--amqp-url="+testkit.AMQPURL(),
		"--schema="+testkit.UniqueName("bench"), "--exchange="+testkit.UniqueName("outboxrelay_bench"),
		"--json="+jsonPath, "--only=drain", "--drain-events=200", "--naive-drain-time=1s", "--drain-wait=30s",
		"--relay-arg=--pprof", "--relay-arg=--http-addr="+addr)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 45 * time.Second
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)

	rows, _, _ := readBenchJSON(t, jsonPath)
	var drain *bench.Result
	for i, r := range rows {
		if r.Workload == "drain" && r.System == "relay" {
			drain = &rows[i]
		}
	}
	require.NotNil(t, drain, "%s", out)
	require.NotNil(t, drain.Cost)
	require.NotNil(t, drain.Cost.ClaimsPer1k, "claims read at %s", addr)
	require.Positive(t, *drain.Cost.ClaimsPer1k)
	require.NotNil(t, drain.Cost.AllocsPerEvent, "allocations read at %s", addr)
}

// readBenchJSON parses the JSON lines of one bench run: its result rows and
// how many machine and ratios lines it has.
func readBenchJSON(t *testing.T, path string) (rows []bench.Result, machines, ratios int) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var line struct {
			Run     string          `json:"run"`
			Machine json.RawMessage `json:"machine"`
			Ratios  json.RawMessage `json:"ratios"`
			bench.Result
		}
		require.NoError(t, json.Unmarshal(sc.Bytes(), &line), sc.Text())
		require.NotEmpty(t, line.Run, sc.Text())
		switch {
		case line.Machine != nil:
			machines++
		case line.Ratios != nil:
			ratios++
		default:
			rows = append(rows, line.Result)
		}
	}
	require.NoError(t, sc.Err())
	return rows, machines, ratios
}

// exchangeGone reports whether RabbitMQ no longer knows the exchange.
func exchangeGone(t *testing.T, name string) bool {
	t.Helper()
	conn, err := amqp.Dial(testkit.AMQPURL())
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	err = ch.ExchangeDeclarePassive(name, amqp.ExchangeTopic, true, false, false, false, nil)
	var aerr *amqp.Error
	return errors.As(err, &aerr) && aerr.Code == amqp.NotFound
}

// A second benchmark on a schema one is already using would truncate and
// drop the outbox under it: it is refused before touching anything.
func TestBenchRefusesASchemaAnotherBenchIsUsing(t *testing.T) {
	t.Parallel()
	dbURL := testkit.NewDatabase(t)
	schema := testkit.UniqueName("bench")
	pool := testkit.NewPool(t, dbURL)
	conn, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(context.Background(), `SELECT pg_advisory_lock(hashtext('outboxrelay bench ' || $1))`, schema)
	require.NoError(t, err)

	code, _, stderr := runOnce(t, binary, []string{"PATH=" + os.Getenv("PATH")},
		"--database-url="+dbURL, "--amqp-url="+testkit.AMQPURL(), "--schema="+schema, "--json=")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "another outboxrelay-bench is running")
	require.EqualValues(t, 0, testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_namespace WHERE nspname = $1`, schema),
		"the refused benchmark created its schema")
}
