// Command outboxrelay-bench benchmarks the outboxrelay binary against a
// naive poller and the broker's own ceiling, on a real PostgreSQL and a
// real RabbitMQ; see docs/performance.md for the method and the results.
//
//	outboxrelay-bench [run]   run the benchmark (the default)
//
// It measures the relay binary --relay-binary names (by default the
// outboxrelay next to its own executable, else the one in PATH), running
// it as "outboxrelay migrate" and "outboxrelay run". The naive poller it
// compares with is its own hidden naive-relay subcommand, which it runs
// from its own executable. --help lists the workloads and their settings.
//
// Exit codes:
//
//	0  every selected workload ran
//	1  a workload failed (the results so far are still printed and
//	   appended)
//	2  bad configuration or usage, no relay binary found, or a service
//	   that cannot be reached at start-up
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/outboxrelay/outboxrelay/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Main(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Exit)
	stop()
	os.Exit(code)
}

// Main runs the command line args and returns the exit code. exit is called
// by --help.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer, exit func(int)) int {
	var c CLI
	cmd, err := cli.Parse("outboxrelay-bench", "Benchmarks the outboxrelay binary against a naive poller and the broker's ceiling.",
		&c, args, stdout, stderr, exit)
	if err == nil {
		switch cmd {
		case "naive-relay":
			err = c.NaiveRelay.Run(ctx, stderr)
		default:
			err = c.Run.Run(ctx, stdout, stderr)
		}
	}
	return cli.ExitCode("outboxrelay-bench", err, stderr)
}

// CLI is the command line.
type CLI struct {
	Run        BenchCmd      `cmd:"" default:"withargs" help:"Benchmark the relay against a naive poller and the broker's ceiling (the default command)."`
	NaiveRelay NaiveRelayCmd `cmd:"" name:"naive-relay" hidden:"" help:"Run the naive poller the benchmark compares with."`
}
