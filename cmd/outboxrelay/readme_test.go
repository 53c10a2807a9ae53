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

// TestReadmeQuickStart does what the README's quick start says: it runs the
// relay command from the repository root and inserts the SQL example with
// psql; the event arrives on the exchange. Only the environment differs: a
// database and an exchange of the test's own, through DATABASE_URL and
// OUTBOX_EXCHANGE, so the test leaves nothing behind.
func TestReadmeQuickStart(t *testing.T) {
	t.Parallel()
	dbURL := testkit.NewDatabase(t)
	exchange := testkit.UniqueName("outboxrelay_readme")
	t.Cleanup(func() { testkit.DeleteExchange(t, exchange) })

	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	cmd := exec.Command("bash", "-c", "exec "+readmeBlock(t, "run-relay"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "OUTBOX_EXCHANGE="+exchange, "OUTBOX_LOG_FORMAT=json")
	out := &testkit.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	// go run starts the relay as its child: signal the whole group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			t.Logf("relay output:\n%s", out.String())
		}
	})

	// The relay declares the exchange once it is up; bind to it then.
	testkit.WaitFor(t, 240*time.Second, "relay started (go run may build first)", func() bool {
		return strings.Contains(out.String(), `"relay started"`)
	})
	queue := testkit.NewQueue(t, exchange, "#")
	// The operations endpoints listen on their default port.
	require.JSONEq(t, `{"ready":true}`, testkit.AwaitStatus(t, "localhost:9464", "/readyz", 200))
	psql(t, dbURL, "-c", readmeBlock(t, "sql-example"))
	d := queue.Receive(t, 1, 30*time.Second)[0]
	require.Equal(t, "order.created", d.RoutingKey)
	require.JSONEq(t, `{"id": 42, "customer": "ada", "total": 99.50}`, string(d.Body))
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
