//go:build faults

package faults

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"go.uber.org/goleak"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// binary is the outboxrelay command the scenarios run, built once without
// the race detector (the main suite runs the relay under it) so that a
// drain takes seconds; FAULTS_RELAY names another one.
var binary string

// seed makes every random choice of the suite; FAULTS_SEED replays a run.
var seed uint64

func TestMain(m *testing.M) {
	seed = uint64(time.Now().UnixNano())
	if s := os.Getenv("FAULTS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			fmt.Fprintln(os.Stderr, "FAULTS_SEED:", err)
			os.Exit(2)
		}
		seed = v
	}
	fmt.Printf("faults: seed %d (replay with FAULTS_SEED=%d)\n", seed, seed)
	dir, err := os.MkdirTemp("", "outboxrelay-faults")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "outboxrelay")
	if b := os.Getenv("FAULTS_RELAY"); b != "" {
		// Another build (an earlier commit's, say), to show what a
		// scenario finds there.
		binary = b
		fmt.Printf("faults: relay %s\n", binary)
	} else {
		build := exec.Command("go", "build", "-o", binary, "../cmd/outboxrelay")
		build.Stdout, build.Stderr = os.Stdout, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build outboxrelay:", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	printReport()
	if code == 0 {
		if err := goleak.Find(testkit.LeakOptions()...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// rng returns the scenario's random source, derived from the suite's seed
// and the scenario's name so that scenarios replay independently.
func rng(t *testing.T) *rand.Rand {
	var h uint64 = 14695981039346656037
	for _, c := range []byte(t.Name()) {
		h = (h ^ uint64(c)) * 1099511628211
	}
	return rand.New(rand.NewPCG(seed, h))
}

// outcome is what one scenario observed over all its runs.
type outcome struct {
	Scenario string
	// Faults is how many faults struck, over all runs.
	Faults     int
	Committed  int
	Delivered  int // distinct events
	Lost       int
	Duplicated int
	// DeadLettered are events that can never be published as they are,
	// failed on purpose: not lost.
	DeadLettered int
	Recovery     []time.Duration // per fault: from the fault to the last event delivered
	// Notes are printed under the table, one line each.
	Notes []string
}

var (
	reportMu sync.Mutex
	report   []outcome
)

func record(o outcome) {
	reportMu.Lock()
	defer reportMu.Unlock()
	report = append(report, o)
}

// printReport prints every scenario's outcome as a Markdown table, the
// figures docs/reliability.md quotes, and the scenarios' notes under it.
func printReport() {
	reportMu.Lock()
	defer reportMu.Unlock()
	if len(report) == 0 {
		return
	}
	// By scenario number (1, 2, … 10), then letter.
	key := func(s string) (int, string) {
		n, _ := strconv.Atoi(strings.TrimRightFunc(strings.Fields(s)[0], unicode.IsLetter))
		return n, s
	}
	sort.Slice(report, func(i, j int) bool {
		ni, si := key(report[i].Scenario)
		nj, sj := key(report[j].Scenario)
		return ni < nj || ni == nj && si < sj
	})
	var b strings.Builder
	fmt.Fprintf(&b, "faults: seed %d\n\n", seed)
	b.WriteString("| scenario | faults | committed | delivered | dead-lettered | lost | duplicated | recovery max | recovery median |\n")
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, o := range report {
		max, median := "-", "-"
		if len(o.Recovery) > 0 {
			r := slices.Clone(o.Recovery)
			slices.Sort(r)
			max, median = r[len(r)-1].Round(time.Millisecond).String(), r[len(r)/2].Round(time.Millisecond).String()
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %d | %s | %s |\n",
			o.Scenario, o.Faults, o.Committed, o.Delivered, o.DeadLettered, o.Lost, o.Duplicated, max, median)
	}
	for _, o := range report {
		for _, n := range o.Notes {
			fmt.Fprintf(&b, "\n- %s: %s", o.Scenario, n)
		}
	}
	fmt.Println(b.String())
}
