package outbox_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// appMain is a program outside the repository that imports the library: in
// one span it writes two events with pgx and one with database/sql, and
// writes two more in transactions it rolls back; it prints the span's
// traceparent.
const appMain = `package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/outboxrelay/outboxrelay/outbox"
)

func main() {
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(databaseURL string) error {
	provider := sdktrace.NewTracerProvider()
	defer provider.Shutdown(context.Background())
	otel.SetTracerProvider(provider)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	ctx, span := otel.Tracer("app").Start(context.Background(), "place orders")
	defer span.End()

	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	db, err := sql.Open("pgx", databaseURL)
	if err != nil {
		return err
	}
	defer db.Close()
	var w outbox.Writer

	// Committed, with pgx.
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return w.Write(ctx, tx,
			outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "created", Payload: map[string]int{"id": 1}},
			outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "paid", Payload: map[string]int{"id": 1},
				Headers: map[string]any{"tenant": "acme"}})
	}); err != nil {
		return err
	}
	// Committed, with database/sql.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := w.WriteSQL(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "2", EventType: "created", Payload: map[string]int{"id": 2}}); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	// Rolled back, with each.
	ptx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	if err := w.Write(ctx, ptx, outbox.Event{AggregateType: "order", AggregateID: "3", EventType: "created", Payload: 3}); err != nil {
		return err
	}
	if err := ptx.Rollback(ctx); err != nil {
		return err
	}
	stx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := w.WriteSQL(ctx, stx, outbox.Event{AggregateType: "order", AggregateID: "4", EventType: "created", Payload: 4}); err != nil {
		return err
	}
	if err := stx.Rollback(); err != nil {
		return err
	}

	carrier := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, carrier)
	fmt.Println(carrier["traceparent"])
	return nil
}
`

// An application outside the repository imports the library; a real relay
// publishes exactly its committed events, each with the traceparent of the
// application's span.
func TestApplicationOutsideTheRepository(t *testing.T) {
	t.Parallel()
	repo, err := filepath.Abs("..")
	require.NoError(t, err)
	dir := t.TempDir()
	goMod := "module example.com/app\n\ngo 1.26\n\n" +
		"require github.com/outboxrelay/outboxrelay v0.0.0\n\n" +
		"replace github.com/outboxrelay/outboxrelay => " + repo + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(goMod), 0o644))
	sum, err := os.ReadFile(filepath.Join(repo, "go.sum"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(appMain), 0o644))

	// The repository's go.sum covers what is built. go mod tidy also reads
	// the go.mod of older versions in the module graph, which the cache of
	// a fresh machine lacks, so the module proxy stays reachable (as it is
	// for the repository's own first build); it was off once, and that
	// failed CI on a new machine.
	goEnv := append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	goCmd := func(dir string, args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir, cmd.Env = dir, goEnv
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "go %s:\n%s", strings.Join(args, " "), out)
	}
	goCmd(dir, "mod", "tidy")
	goCmd(dir, "build", "-o", "app", ".")
	relayBin := filepath.Join(dir, "outboxrelay")
	goCmd(repo, "build", "-o", relayBin, "./cmd/outboxrelay")

	databaseURL, pool := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "#")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	app := exec.CommandContext(ctx, filepath.Join(dir, "app"), databaseURL)
	app.Stderr = os.Stderr
	out, err := app.Output()
	require.NoError(t, err)
	traceparent := strings.TrimSpace(string(out))
	require.Regexp(t, `^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`, traceparent)
	require.Equal(t, int64(3), testkit.QueryInt(t, pool, "SELECT count(*) FROM outbox"), "the committed events, not the rolled-back ones")

	relay := testkit.StartProcess(t, relayBin, []string{
		"PATH=" + os.Getenv("PATH"),
		"DATABASE_URL=" + databaseURL,
		"AMQP_URL=" + testkit.AMQPURL(),
		"OUTBOX_EXCHANGE=" + exchange,
		"OUTBOX_LOG_FORMAT=json",
		"OUTBOX_HTTP_ADDR=127.0.0.1:0",
	})
	deliveries := queue.Receive(t, 3, 30*time.Second)
	testkit.WaitFor(t, 30*time.Second, "every event marked published", func() bool {
		return testkit.QueryInt(t, pool, "SELECT count(*) FROM outbox WHERE status = 'published'") == 3
	})
	deliveries = append(deliveries, queue.Drain(t, 10*time.Second)...)
	relay.Stop(30 * time.Second)

	type got struct{ RoutingKey, AggregateID, Body, Tenant string }
	var arrived []got
	for _, d := range deliveries {
		require.Equal(t, traceparent, d.Headers["traceparent"], "message %s", d.MessageId)
		tenant, _ := d.Headers["tenant"].(string)
		arrived = append(arrived, got{d.RoutingKey, d.Headers["aggregate_id"].(string), string(d.Body), tenant})
	}
	require.ElementsMatch(t, []got{
		{"order.created", "1", `{"id": 1}`, ""},
		{"order.paid", "1", `{"id": 1}`, "acme"},
		{"order.created", "2", `{"id": 2}`, ""},
	}, arrived, "exactly the committed events")
}
