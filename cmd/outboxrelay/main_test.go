package main_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/migrations"
)

// binary is the outboxrelay command, built once for the package's tests:
// the relay runs as a real process that can be killed.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "outboxrelay-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "outboxrelay")
	build := exec.Command("go", "build", "-race", "-o", binary, ".")
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build outboxrelay:", err)
		os.Exit(1)
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

// relayEnv is the environment a test's relay runs with: its database, the
// local RabbitMQ, JSON logs, and quick polls.
func relayEnv(databaseURL, exchange string, extra ...string) []string {
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"DATABASE_URL=" + databaseURL,
		"AMQP_URL=" + testkit.AMQPURL(),
		"OUTBOX_EXCHANGE=" + exchange,
		"OUTBOX_LOG_FORMAT=json",
		"OUTBOX_HTTP_ADDR=127.0.0.1:0", // metrics on, on a port of its own
	}
	return append(env, extra...)
}

// startRelay runs the outboxrelay binary as a real process.
func startRelay(t *testing.T, env []string, args ...string) *testkit.Process {
	t.Helper()
	return testkit.StartProcess(t, binary, env, args...)
}

// startedRelay runs the binary as startRelay does and waits until it logs
// "relay started" (failing at once if it exits first).
func startedRelay(t *testing.T, env []string, args ...string) *testkit.Process {
	t.Helper()
	p := startRelay(t, env, args...)
	p.AwaitOutput(30*time.Second, "relay started", func(out string) bool {
		return strings.Contains(out, `"relay started"`)
	})
	return p
}

// runOnce runs the binary to completion and returns its exit code and output.
func runOnce(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
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
		t.Fatalf("run outboxrelay: %v", err)
		return -1, "", ""
	}
}

func TestHelpListsEverySettingWithItsVariable(t *testing.T) {
	t.Parallel()
	secrets := []string{"DATABASE_URL=postgres://u:s3cret@h/db", "AMQP_URL=amqp://u:s3cret@h/"}
	code, stdout, _ := runOnce(t, secrets, "--help")
	require.Equal(t, 0, code)
	require.Contains(t, stdout, "run")
	require.Contains(t, stdout, "migrate")
	require.NotContains(t, stdout, "bench", "the benchmark is a command of its own, outboxrelay-bench")
	for _, args := range [][]string{{"run", "--help"}, {"migrate", "--help"}} {
		code, stdout, _ := runOnce(t, secrets, args...)
		require.Equal(t, 0, code, args)
		require.Contains(t, stdout, "DATABASE_URL", args)
		require.NotContains(t, stdout, "s3cret", "--help must not print passwords")
	}
	_, stdout, _ = runOnce(t, nil, "run", "--help")
	for _, v := range []string{"AMQP_URL", "OUTBOX_BATCH_SIZE", "OUTBOX_MAX_BATCH_BYTES", "OUTBOX_WORKERS", "OUTBOX_MARK_DELAY", "OUTBOX_PROCS", "OUTBOX_POLL_INTERVAL", "OUTBOX_LEASE",
		"OUTBOX_RETENTION", "OUTBOX_TABLE", "OUTBOX_STATUS_PENDING", "OUTBOX_COLUMN_ID", "--no-migrate"} {
		require.Contains(t, stdout, v)
	}
}

func TestBadConfigurationExitsTwoAndClaimsNothing(t *testing.T) {
	t.Parallel()
	url, pool := testkit.NewOutbox(t)
	testkit.InsertEvents(t, pool, 10)
	exchange := testkit.NewExchange(t)
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"malformed database URL", relayEnv("postgres://u:s3cret@[::1", exchange), nil, "DATABASE_URL"},
		{"malformed AMQP URL", relayEnv(url, exchange, "AMQP_URL=http://u:s3cret@localhost/"), nil, "AMQP_URL"},
		{"negative batch size", relayEnv(url, exchange), []string{"--batch-size=-1"}, "--batch-size -1"},
		{"negative batch size from the environment", relayEnv(url, exchange, "OUTBOX_BATCH_SIZE=-5"), nil, "--batch-size -5"},
		{"negative retention", relayEnv(url, exchange, "OUTBOX_RETENTION=-1s"), nil, "--retention -1s"},
		{"zero batch bytes", relayEnv(url, exchange, "OUTBOX_MAX_BATCH_BYTES=0"), nil, "--max-batch-bytes 0"},
		{"not a number", relayEnv(url, exchange, "OUTBOX_WORKERS=many"), nil, "workers"},
		{"negative mark delay", relayEnv(url, exchange, "OUTBOX_MARK_DELAY=-1ms"), nil, "--mark-delay -1ms"},
		{"negative procs", relayEnv(url, exchange), []string{"--procs=-1"}, "--procs -1"},
		{"unknown flag", relayEnv(url, exchange), []string{"--bogus"}, "--bogus"},
		{"profiles without the endpoints", relayEnv(url, exchange), []string{"--pprof", "--http-addr="}, "--pprof"},
		{"lease shorter than confirms", relayEnv(url, exchange), []string{"--lease=1s", "--confirm-timeout=5s"}, "--lease"},
		{"bad status value", relayEnv(url, exchange), []string{"--status-pending=it's"}, "Statuses.Pending"},
		{"missing table", relayEnv(url, exchange), []string{"--no-migrate", "--table=nope"}, "nope"},
		{"unknown ordering", relayEnv(url, exchange, "OUTBOX_ORDERING=sideways"), nil, "ordering"},
		{"id in the ordering key", relayEnv(url, exchange), []string{"--ordering=aggregate", "--ordering-key=aggregate_id,id"}, "--ordering-key"},
		{"ordered without its index", relayEnv(url, exchange), []string{"--no-migrate", "--ordering=aggregate"}, "no ordering index"},
		{"a standby asked for", relayEnv(testkit.WithParam(url, "target_session_attrs=standby"), exchange), nil, "target_session_attrs=standby"},
		{"unreachable database", relayEnv("postgres://u:s3cret@127.0.0.1:1/db?connect_timeout=5", exchange), nil, "PostgreSQL"},
		{"unreachable RabbitMQ", relayEnv(url, exchange, "AMQP_URL=amqp://u:s3cret@127.0.0.1:1/"), nil, "RabbitMQ"},
		{"no RabbitMQ of a list answering", relayEnv(url, exchange, "AMQP_URL=amqp://u:s3cret@127.0.0.1:1/,amqp://v:s3cret2@127.0.0.1:2/"), nil, "none of 2 brokers answered"},
		{"malformed URL in a list", relayEnv(url, exchange, "AMQP_URL="+testkit.AMQPURL()+",http://u:s3cret@localhost/"), nil, "URL 2 of 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runOnce(t, tc.env, tc.args...)
			require.Equal(t, 2, code, stderr)
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			last := lines[len(lines)-1]
			require.Contains(t, last, tc.want)
			require.True(t, strings.HasPrefix(last, "outboxrelay: "), last)
			require.NotContains(t, stderr, "s3cret")
		})
	}
	require.Equal(t, int64(10), testkit.QueryInt(t, pool,
		`SELECT count(*) FROM outbox WHERE status = 'pending' AND attempts = 0 AND lease_id IS NULL`), "nothing may be claimed")
}

func TestMigrationsTwiceAndConcurrently(t *testing.T) {
	t.Parallel()
	url := testkit.NewDatabase(t)
	env := relayEnv(url, "unused")
	var wg sync.WaitGroup
	results := make([]int, 3)
	outputs := make([]string, 3)
	for i := range 3 {
		wg.Go(func() { results[i], _, outputs[i] = runOnce(t, env, "migrate") })
	}
	wg.Wait()
	for i := range results {
		require.Equal(t, 0, results[i], outputs[i])
	}
	code, _, stderr := runOnce(t, env, "migrate")
	require.Equal(t, 0, code, stderr)
	pool := testkit.NewPool(t, url)
	latest, err := migrations.Latest()
	require.NoError(t, err)
	require.Equal(t, int64(latest), testkit.QueryInt(t, pool, `SELECT version FROM outboxrelay_schema_version`))
	require.Equal(t, int64(1), testkit.QueryInt(t, pool, `SELECT count(*) FROM outboxrelay_schema_version`))
	require.Equal(t, int64(1), testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_tables WHERE tablename = 'outbox'`))
	require.Equal(t, int64(1), testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_trigger WHERE tgname = 'outbox_notify'`))
	require.Equal(t, int64(5), testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_indexes WHERE tablename = 'outbox'`))
}

// SIGTERM while the relay is still connecting is the shutdown asked for:
// exit code 0, not a start-up failure. The database here accepts the
// connection and never answers.
func TestSIGTERMDuringStartUpExitsCleanly(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		select {
		case c := <-accepted:
			c.Close()
		default:
		}
	})
	p := testkit.StartProcess(t, binary, relayEnv("postgres://postgres@"+ln.Addr().String()+"/db?connect_timeout=60", "unused"))
	var conn net.Conn
	select {
	case conn = <-accepted:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay never connected")
	}
	defer conn.Close()
	p.Stop(30 * time.Second)
	require.Contains(t, p.Out.String(), "stopped during start-up")
}
