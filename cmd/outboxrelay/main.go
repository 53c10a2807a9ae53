// Command outboxrelay relays events from a PostgreSQL outbox table to
// RabbitMQ: LISTEN/NOTIFY wakes it, FOR UPDATE SKIP LOCKED claims, publisher
// confirms prove delivery. See README.md.
//
//	outboxrelay [run]     relay events (the default; applies migrations first)
//	outboxrelay migrate   apply the schema migrations and exit
//	outboxrelay status    counts per status, oldest pending age, dead letters by type, blocked aggregates
//	outboxrelay dead      list dead-lettered events
//	outboxrelay requeue   put dead-lettered events back to pending and wake the relays
//	outboxrelay emit      insert test events, once, --count N of them, or at a --rate
//	outboxrelay sql       print the drop-in install SQL for --table and its mapping
//	outboxrelay tail      print the messages arriving on an exchange (a temporary queue)
//
// Every flag has an environment variable; --help lists them with defaults.
// The admin subcommands (status, dead, requeue, emit, sql) take run's
// database, table, column, status and ordering flags; they print data on
// stdout (a table, or JSON with --json) and diagnostics on stderr.
//
// Exit codes:
//
//	0  success: a clean shutdown of run; an admin command that did its
//	   work, including one that found nothing (dead with no match, requeue
//	   matching nothing or an --id that is not dead-lettered, which it
//	   names on stderr) and emit stopped by SIGINT/SIGTERM
//	1  any other failure (a statement that failed, a permission denied,
//	   a connection lost while working)
//	2  bad configuration or usage (an unknown flag, a bad value, requeue
//	   without exactly one of --id, --event-type, --all, a table or column
//	   that does not exist) or a service that cannot be reached at start-up
//
// Compatibility: the commands, flags, environment variables, exit codes,
// metric names and labels, and the fields of the JSON logs are the
// promise; until v1.0.0 a change that breaks them is named in
// CHANGELOG.md. Log messages' wording is not.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/alecthomas/kong"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// usageError is a configuration problem or a service unreachable at
// start-up: exit code 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Main(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Exit)
	stop()
	os.Exit(code)
}

// Main runs the command line args and returns the exit code. exit is called
// by --help.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer, exit func(int)) int {
	var cli CLI
	parser, err := kong.New(&cli,
		kong.Name("outboxrelay"),
		kong.Description("Relays events from a PostgreSQL outbox table to RabbitMQ with publisher confirms."),
		kong.Writers(stdout, stderr),
		kong.Exit(exit),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
	)
	if err != nil {
		fmt.Fprintf(stderr, "outboxrelay: %v\n", err)
		return exitFailure
	}
	kctx, err := parser.Parse(args)
	if err != nil {
		fmt.Fprintf(stderr, "outboxrelay: %s\n", oneLine(err.Error()))
		return exitUsage
	}
	switch kctx.Command() {
	case "migrate":
		err = cli.Migrate.Run(ctx, stderr)
	case "bench":
		err = cli.Bench.Run(ctx, stdout, stderr)
	case "naive-relay":
		err = cli.NaiveRelay.Run(ctx, stderr)
	case "status":
		err = cli.Status.Run(ctx, stdout)
	case "dead":
		err = cli.Dead.Run(ctx, stdout, stderr)
	case "requeue":
		err = cli.Requeue.Run(ctx, stdout, stderr)
	case "emit":
		err = cli.Emit.Run(ctx, stdout, stderr)
	case "sql":
		err = cli.SQL.Run(stdout)
	case "tail":
		err = cli.Tail.Run(ctx, stdout, stderr)
	default:
		err = cli.Run.Run(ctx, stderr)
	}
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(stderr, "outboxrelay: %s\n", oneLine(err.Error()))
	if errors.As(err, new(usageError)) {
		return exitUsage
	}
	return exitFailure
}

// CLI is the command line.
type CLI struct {
	Run     RunCmd     `cmd:"" default:"withargs" help:"Relay events from the outbox to RabbitMQ (the default command)."`
	Migrate MigrateCmd `cmd:"" help:"Apply the schema migrations and exit."`

	Status  StatusCmd  `cmd:"" help:"Show counts per status, the oldest pending event's age, dead-lettered events by type and blocked aggregates."`
	Dead    DeadCmd    `cmd:"" help:"List dead-lettered events."`
	Requeue RequeueCmd `cmd:"" help:"Put dead-lettered events back to pending, attempts reset, and wake the relays."`
	Emit    EmitCmd    `cmd:"" help:"Insert test events, for smoke tests and demos."`
	SQL     SQLCmd     `cmd:"" name:"sql" help:"Print the drop-in install SQL for --table and its mapping, to pipe into psql."`
	Tail    TailCmd    `cmd:"" help:"Print the messages arriving on an exchange, through a temporary queue, until interrupted."`

	Bench      BenchCmd      `cmd:"" help:"Benchmark the relay against a naive poller and the broker's ceiling."`
	NaiveRelay NaiveRelayCmd `cmd:"" name:"naive-relay" hidden:"" help:"Run the naive poller the benchmark compares with."`
}

// oneLine folds a multi-line error (pgx lists every host it tried on a line
// of its own) into one line.
func oneLine(s string) string {
	lines := strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' })
	for i, l := range lines {
		lines[i] = strings.TrimSpace(l)
	}
	return strings.Join(lines, " ")
}
