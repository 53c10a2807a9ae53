package main_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// readmeBlock returns the code block that follows the marker
// <!-- readme-test: name --> in README.md.
func readmeBlock(t *testing.T, name string) string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	re := regexp.MustCompile("(?s)<!-- readme-test: " + regexp.QuoteMeta(name) + " -->\\s*```[a-z]*\\n(.*?)```")
	m := re.FindSubmatch(readme)
	require.NotNil(t, m, "README.md has no %q block", name)
	return strings.TrimSpace(string(m[1]))
}

// TestReadmeQuickStart does what the README's quick start says, in its
// order: it runs the relay command from the repository root, then the tail
// command (with --count=1, so that it exits once it printed the event),
// and inserts the SQL example with psql; tail prints the event, which also
// arrives on a queue of the test's. Only the environment differs: a
// database and an exchange of the test's own, through DATABASE_URL and
// OUTBOX_EXCHANGE, so the test leaves nothing behind.
func TestReadmeQuickStart(t *testing.T) {
	t.Parallel()
	dbURL := testkit.NewDatabase(t)
	exchange := testkit.UniqueName("outboxrelay_readme")
	t.Cleanup(func() { testkit.DeleteExchange(t, exchange) })
	// The operations endpoints on a port of their own rather than the
	// default the README names, which TestReadmeNamesTheDefaultPort checks.
	env := []string{"DATABASE_URL=" + dbURL, "OUTBOX_EXCHANGE=" + exchange, "OUTBOX_LOG_FORMAT=json", "OUTBOX_HTTP_ADDR=127.0.0.1:0"}

	relay := startReadmeCommand(t, env, readmeBlock(t, "run-relay"))
	// The relay declares the exchange once it is up; bind to it then.
	relay.await(t, 240*time.Second, "relay started (go run may build first)", `"relay started"`)
	queue := testkit.NewQueue(t, exchange, "#")
	require.JSONEq(t, `{"ready":true}`, testkit.AwaitStatus(t, testkit.HTTPAddr(t, relay.out), "/readyz", 200))
	tail := startReadmeCommand(t, env, readmeBlock(t, "tail")+" --count=1")
	tail.await(t, 240*time.Second, "tail bound its queue", "waiting for messages")
	psql(t, dbURL, "-c", readmeBlock(t, "sql-example"))
	d := queue.Receive(t, 1, 30*time.Second)[0]
	require.Equal(t, "order.created", d.RoutingKey)
	require.JSONEq(t, `{"id": 42, "customer": "ada", "total": 99.50}`, string(d.Body))

	select {
	case <-tail.exited:
		require.NoError(t, tail.err, tail.out.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("tail --count=1 did not exit after the event arrived:\n%s", tail.out.String())
	}
	out := tail.out.String()
	require.Contains(t, out, exchange+" order.created message_id="+d.MessageId+" type=created")
	require.Contains(t, out, "  aggregate_type: order\n")
	require.Contains(t, out, `"customer": "ada"`)
}

// TestReadmeNamesTheDefaultPort: the quick start says where the relay
// serves its operations endpoints, and that is --http-addr's default.
func TestReadmeNamesTheDefaultPort(t *testing.T) {
	t.Parallel()
	help, err := exec.Command(binary, "run", "--help").CombinedOutput()
	require.NoError(t, err, "%s", help)
	require.Contains(t, string(help), `--http-addr=":9464"`)
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	require.Contains(t, string(readme), "serves its metrics and\nhealth endpoints on port 9464")
}

// readmeCommand is a README command run as the README runs it: by bash,
// from the repository root, in a process group of its own (go run starts
// the command as its child), with the test's environment added.
type readmeCommand struct {
	out    *testkit.Buffer
	exited chan struct{} // closed once the command has exited, with err
	err    error
}

func startReadmeCommand(t *testing.T, env []string, command string) *readmeCommand {
	t.Helper()
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	cmd := exec.Command("bash", "-c", "exec "+command)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	c := &readmeCommand{out: &testkit.Buffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = c.out, c.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	go func() { c.err = cmd.Wait(); close(c.exited) }()
	t.Cleanup(func() {
		// Signal the whole group: go run's child too.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-c.exited:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-c.exited
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", command, c.out.String())
		}
	})
	return c
}

// await waits until the command's output holds want. It fails at once if
// the command exits first (a relay refused a busy port, say), and
// after timeout otherwise.
func (c *readmeCommand) await(t *testing.T, timeout time.Duration, what, want string) {
	t.Helper()
	deadline := time.After(timeout)
	for !strings.Contains(c.out.String(), want) {
		select {
		case <-c.exited:
			if !strings.Contains(c.out.String(), want) {
				t.Fatalf("%s: the command exited first (%v)", what, c.err)
			}
		case <-deadline:
			t.Fatalf("%s: not within %s", what, timeout)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// TestCIRunsTheReadmeTestCommand keeps .ci/run and the README in step.
func TestCIRunsTheReadmeTestCommand(t *testing.T) {
	t.Parallel()
	ci, err := os.ReadFile("../../.ci/run")
	require.NoError(t, err)
	require.Contains(t, string(ci), "\n"+readmeBlock(t, "run-tests")+"\n")
}

// TestEveryAlertHasARunbookInTheOperationsGuide checks that each alert's
// runbook annotation points at an anchor docs/operations.md has.
func TestEveryAlertHasARunbookInTheOperationsGuide(t *testing.T) {
	t.Parallel()
	rules, err := os.ReadFile("../../monitoring/prometheus/alerts.yml")
	require.NoError(t, err)
	ops, err := os.ReadFile("../../docs/operations.md")
	require.NoError(t, err)
	links := regexp.MustCompile(`runbook: \S+docs/operations\.md#(\S+)`).FindAllStringSubmatch(string(rules), -1)
	alerts := regexp.MustCompile(`(?m)^\s*- alert: `).FindAllString(string(rules), -1)
	require.Len(t, links, len(alerts), "a runbook per alert")
	for _, l := range links {
		require.Contains(t, string(ops), `<a id="`+l[1]+`"></a>`, "docs/operations.md anchor for runbook #%s", l[1])
	}
}

// TestConfigTableCoversRunHelp holds docs/operations.md's configuration
// table, which TestConfigTable renders from the flag model, to what the
// built binary's `outboxrelay run --help` prints: every flag it lists has a
// row of the table.
func TestConfigTableCoversRunHelp(t *testing.T) {
	t.Parallel()
	ops, err := os.ReadFile("../../docs/operations.md")
	require.NoError(t, err)
	_, table, found := strings.Cut(string(ops), "<!-- config:begin -->")
	require.True(t, found, "docs/operations.md has no configuration table")
	table, _, found = strings.Cut(table, "<!-- config:end -->")
	require.True(t, found, "docs/operations.md's configuration table has no end")
	code, help, stderr := runOnce(t, []string{"PATH=" + os.Getenv("PATH")}, "run", "--help")
	require.Equal(t, 0, code, stderr)
	// A flag starts its line, indented a little; a wrapped help line is
	// indented to the help column.
	flags := regexp.MustCompile(`(?m)^ {1,8}(?:-[a-z], )?(--(?:\[no-\])?[a-z0-9-]+)`).FindAllStringSubmatch(help, -1)
	require.Greater(t, len(flags), 30, help)
	for _, f := range flags {
		if f[1] == "--help" {
			continue
		}
		require.Contains(t, table, "| `"+f[1]+"` |", "docs/operations.md's configuration table lacks %s", f[1])
	}
}
