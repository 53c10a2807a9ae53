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
	cmd, err := cli.Parse("outboxrelay", "Relays events from a PostgreSQL outbox table to RabbitMQ with publisher confirms.",
		&c, args, stdout, stderr, exit)
	if err == nil {
		err = c.run(ctx, cmd, stdout, stderr)
	}
	return cli.ExitCode("outboxrelay", err, stderr)
}

// run runs the command cmd.
func (c *CLI) run(ctx context.Context, cmd string, stdout, stderr io.Writer) error {
	switch cmd {
	case "migrate":
		return c.Migrate.Run(ctx, stderr)
	case "status":
		return c.Status.Run(ctx, stdout)
	case "dead":
		return c.Dead.Run(ctx, stdout, stderr)
	case "requeue":
		return c.Requeue.Run(ctx, stdout, stderr)
	case "emit":
		return c.Emit.Run(ctx, stdout, stderr)
	case "sql":
		return c.SQL.Run(stdout)
	case "tail":
		return c.Tail.Run(ctx, stdout, stderr)
	default:
		return c.Run.Run(ctx, stderr)
	}
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
}
