package main_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// TestApplicationOfTheLibraryThroughTheRelay: an application outside the
// repository whose module requires only the producer library (the module
// github.com/outboxrelay/outboxrelay/outbox, through a replace to this
// repository's outbox directory) writes events; a real relay publishes
// exactly its committed events, each with the traceparent of the
// application's span. The application is the library's own test program,
// outbox/testdata/app/main.go; the library's module test checks its module
// graph.
func TestApplicationOfTheLibraryThroughTheRelay(t *testing.T) {
	t.Parallel()
	library, err := filepath.Abs(filepath.Join("..", "..", "outbox"))
	require.NoError(t, err)
	main, err := os.ReadFile(filepath.Join(library, "testdata", "app", "main.go"))
	require.NoError(t, err)
	sum, err := os.ReadFile(filepath.Join(library, "go.sum"))
	require.NoError(t, err)
	libraryMod, err := os.ReadFile(filepath.Join(library, "go.mod"))
	require.NoError(t, err)
	goLine := regexp.MustCompile(`(?m)^go \S+$`).Find(libraryMod)
	require.NotNil(t, goLine, "the library's go line")
	dir := t.TempDir()
	goMod := fmt.Sprintf("module example.com/app\n\n%s\n\nrequire github.com/outboxrelay/outboxrelay/outbox v0.0.0\n\n"+
		"replace github.com/outboxrelay/outboxrelay/outbox => %s\n", goLine, library)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(goMod), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), main, 0o644))

	// The library's go.sum covers most of what is built; go mod tidy may
	// still read go.mod files a fresh machine's cache lacks, so the module
	// proxy stays reachable (as for the repository's own first build).
	goEnv := append(os.Environ(), "GOWORK=off", "GOTOOLCHAIN=local")
	goCmd := func(args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir, cmd.Env = dir, goEnv
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "go %s:\n%s", strings.Join(args, " "), out)
	}
	goCmd("mod", "tidy")
	goCmd("build", "-o", "app", ".")

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

	relay := startRelay(t, relayEnv(databaseURL, exchange))
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
