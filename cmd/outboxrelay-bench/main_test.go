package main_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// binary is the outboxrelay-bench command, built once for the package's
// tests with the outboxrelay command beside it, where it finds the relay
// to measure by default.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "outboxrelay-bench-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "outboxrelay-bench")
	for _, b := range []struct{ out, pkg string }{{binary, "."}, {filepath.Join(dir, "outboxrelay"), "../outboxrelay"}} {
		build := exec.Command("go", "build", "-race", "-o", b.out, b.pkg)
		build.Stdout, build.Stderr = os.Stdout, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n", b.pkg, err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(testkit.LeakOptions()...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// runOnce runs exe to completion and returns its exit code and output.
func runOnce(t *testing.T, exe string, env []string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, stdout.String(), stderr.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), stdout.String(), stderr.String()
	default:
		t.Fatalf("run %s: %v", exe, err)
		return -1, "", ""
	}
}

// The help lists the benchmark's settings, --relay-binary among them, and
// hides the naive poller, which is not for users.
func TestHelpListsTheRelayBinaryAndHidesTheNaiveRelay(t *testing.T) {
	t.Parallel()
	code, stdout, stderr := runOnce(t, binary, nil, "--help")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "run")
	require.NotContains(t, stdout, "naive-relay")
	code, stdout, stderr = runOnce(t, binary, nil, "run", "--help")
	require.Equal(t, 0, code, stderr)
	for _, want := range []string{"--relay-binary", "--only", "--relay-arg", "--ordered-shapes", "--horizon-rate"} {
		require.Contains(t, stdout, want)
	}
	require.NotContains(t, stdout, "ordered-distinct")
}

// Without the relay to measure the benchmark stops at once, exit code 2,
// naming the flag that fixes it: when --relay-binary names nothing, and
// when there is no outboxrelay beside it or in PATH.
func TestBenchWithoutARelayBinaryNamesTheFlag(t *testing.T) {
	t.Parallel()
	dbURL := "postgres://postgres@127.0.0.1:1/none" // never reached
	missing := filepath.Join(t.TempDir(), "outboxrelay")
	code, _, stderr := runOnce(t, binary, nil, "--relay-binary="+missing, "--database-url="+dbURL, "--json=")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, "outboxrelay-bench: --relay-binary "+missing)

	// A copy of the benchmark alone in a directory, with an empty PATH.
	alone := filepath.Join(t.TempDir(), "outboxrelay-bench")
	copyFile(t, binary, alone)
	code, _, stderr = runOnce(t, alone, []string{"PATH=" + t.TempDir()}, "--database-url="+dbURL, "--json=")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, "no outboxrelay binary at "+filepath.Join(filepath.Dir(alone), "outboxrelay")+" or in PATH")
	require.Contains(t, stderr, "--relay-binary")
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	require.NoError(t, err)
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	require.NoError(t, err)
	_, err = io.Copy(out, in)
	require.NoError(t, errors.Join(err, out.Close()))
}
