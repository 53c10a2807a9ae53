package outbox_test

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestMain fails the package when goroutines outlive its tests: a pool or a
// database/sql handle a test left open, or a goroutine the library started
// (it starts none). The relay's packages check this with goleak; the
// library's tests use the standard library only, so this is the same check
// by hand.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if leaked := lingeringGoroutines(10 * time.Second); leaked != "" {
			fmt.Fprintf(os.Stderr, "goroutines outlived the tests:\n\n%s\n", leaked)
			code = 1
		}
	}
	os.Exit(code)
}

// lingeringGoroutines waits up to timeout for every goroutine but this one
// (and those of signal handling and the execution tracer, which belong to
// the process) to end, and returns the stacks of those still running, or ""
// when all ended.
func lingeringGoroutines(timeout time.Duration) string {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		others := otherGoroutines()
		if len(others) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			return strings.Join(others, "\n\n")
		}
		<-tick.C
	}
}

// otherGoroutines returns the stacks of the goroutines other than the
// calling one, and other than the process's own, the way runtime.Stack
// prints them.
func otherGoroutines() []string {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var others []string
	for i, g := range strings.Split(string(buf), "\n\n") {
		switch {
		case i == 0: // runtime.Stack prints the calling goroutine first
		case strings.Contains(g, "os/signal."), strings.Contains(g, "runtime.ensureSigM"), strings.Contains(g, "runtime/trace."):
		default:
			others = append(others, g)
		}
	}
	return others
}
