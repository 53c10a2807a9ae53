package testkit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/outboxrelay/outboxrelay/internal/redact"
)

// pgbouncerBinary is where Debian's pgbouncer package installs PgBouncer;
// /usr/sbin is not on every user's PATH, so it is the fallback when PATH has
// no pgbouncer.
const pgbouncerBinary = "/usr/sbin/pgbouncer"

// NewPgBouncer starts a PgBouncer for this test in front of the PostgreSQL
// server that databaseURL names, in transaction pooling mode as production
// runs it, and returns a URL to the same database, as the same user, through
// it (sslmode=disable). In that mode a client has a server connection only
// for the length of a transaction, so what a session keeps (named prepared
// statements, session settings, LISTEN, session advisory locks) does not
// follow the client from one transaction to the next, and PgBouncer 1.18
// refuses a connection whose startup packet carries a parameter it does not
// track, such as statement_timeout or options ("unsupported startup
// parameter"). Tests use it to show that the relay works behind such a
// pooler. PgBouncer listens on a free loopback port, trusts its clients and
// is stopped when the test ends; it needs Debian's pgbouncer package, which
// .ci/test installs. PgBouncer refuses to run as root, so a test run by root
// runs it as the postgres user.
func NewPgBouncer(t testing.TB, databaseURL string) string {
	t.Helper()
	u, err := url.Parse(databaseURL)
	if err != nil {
		t.Fatalf("testkit: parse %s: %v", redact.URL(databaseURL), err)
	}
	database := strings.TrimPrefix(u.Path, "/")
	if database == "" {
		t.Fatalf("testkit: %s names no database", redact.URL(databaseURL))
	}
	user := cmp.Or(u.User.Username(), "postgres")
	password, _ := u.User.Password()
	binary, err := exec.LookPath("pgbouncer")
	if err != nil {
		binary = pgbouncerBinary
	}
	if _, err := os.Stat(binary); err != nil {
		t.Fatalf("testkit: no PgBouncer (%v): install Debian's pgbouncer package (.ci/test does)", err)
	}

	dir := t.TempDir()
	var runAs []string
	if os.Geteuid() == 0 {
		// PgBouncer exits at once as root ("PgBouncer should not run as
		// root"); -u makes it switch to postgres, which then opens its log
		// file in dir and must reach dir through its parent (both made
		// private by t.TempDir).
		runAs = []string{"-u", "postgres"}
		for _, d := range []struct {
			path string
			mode os.FileMode
		}{{filepath.Dir(dir), 0o755}, {dir, 0o777}} {
			if err := os.Chmod(d.path, d.mode); err != nil {
				t.Fatalf("testkit: chmod %s: %v", d.path, err)
			}
		}
	}
	authFile := filepath.Join(dir, "userlist.txt")
	logFile := filepath.Join(dir, "pgbouncer.log")
	// With auth_type = trust PgBouncer checks no client password, but the
	// user must still be in auth_file, whose password it uses to log in to
	// the server.
	writeReadable(t, authFile, fmt.Sprintf("%s %s\n", pgbouncerQuote(user), pgbouncerQuote(password)))

	for attempt := 1; ; attempt++ {
		port := freePort(t)
		config := filepath.Join(dir, "pgbouncer.ini")
		writeReadable(t, config, fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
default_pool_size = 10
max_client_conn = 200
; pgx sends none of these unless asked; anything else a client sends in
; its startup packet is refused, as in production.
ignore_startup_parameters = extra_float_digits
server_reset_query =
; The default, said outright: an idle server connection is handed out last
; in, first out, so a client that starts a transaction gets the server the
; previous transaction released.
server_round_robin = 0
logfile = %s
`, cmp.Or(u.Hostname(), "127.0.0.1"), cmp.Or(u.Port(), "5432"), port, authFile, logFile))

		out := &Buffer{}
		cmd := exec.Command(binary, append(runAs, config)...)
		cmd.Stdout, cmd.Stderr = out, out
		// Not a service: keep it from reporting to a service manager that
		// happens to run the tests.
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "NOTIFY_SOCKET=") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		if err := cmd.Start(); err != nil {
			t.Fatalf("testkit: start %s: %v", binary, err)
		}
		done := make(chan struct{})
		var logged bool // the log is in a message already, or will be
		go func() {
			cmd.Wait()
			close(done)
		}()
		t.Cleanup(func() {
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				cmd.Process.Kill()
				<-done
			}
			if t.Failed() && !logged {
				t.Logf("testkit: PgBouncer log:\n%s", pgbouncerLog(logFile, out))
			}
		})

		bouncerURL := *u
		bouncerURL.User = url.User(user)
		bouncerURL.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		bouncerURL.RawQuery = "sslmode=disable"
		var exited bool
		var lastErr error
		ready := poll(15*time.Second, 20*time.Millisecond, func() bool {
			select {
			case <-done:
				exited = true
				return true
			default:
			}
			lastErr = pingPgBouncer(bouncerURL.String())
			return lastErr == nil
		})
		switch {
		case exited && attempt < 3 && strings.Contains(out.String(), "Address already in use"):
			// Something took the port between freePort and PgBouncer's bind.
			// (The next attempt appends to the same log file.)
			logged = true
			t.Logf("testkit: PgBouncer could not listen on port %d; trying another", port)
			continue
		case exited:
			logged = true
			t.Fatalf("testkit: PgBouncer exited (%v):\n%s", cmd.ProcessState, pgbouncerLog(logFile, out))
		case !ready:
			logged = true
			t.Fatalf("testkit: PgBouncer did not answer within 15s (last error: %v):\n%s", lastErr, pgbouncerLog(logFile, out))
		}
		return bouncerURL.String()
	}
}

// pingPgBouncer connects to rawURL and runs SELECT 1, without prepared
// statements.
func pingPgBouncer(rawURL string) error {
	cfg, err := pgx.ParseConfig(rawURL)
	if err != nil {
		return err
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	cfg.ConnectTimeout = 2 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "SELECT 1")
	return err
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testkit: find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// pgbouncerQuote quotes s for PgBouncer's auth_file: in double quotes, a
// double quote doubled.
func pgbouncerQuote(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// writeReadable writes content to path, readable by all (PgBouncer may run as
// another user).
func writeReadable(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatalf("testkit: %v", err)
	}
	// WriteFile's mode is subject to the umask.
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatalf("testkit: %v", err)
	}
}

// pgbouncerLog returns PgBouncer's log file, or, while it has none (it could not
// open it, or failed before), what it wrote to stderr.
func pgbouncerLog(logFile string, out *Buffer) string {
	b, err := os.ReadFile(logFile)
	if err != nil || len(b) == 0 {
		return fmt.Sprintf("(log file: %v)\n%s", cmp.Or(err, errors.New("empty")), out.String())
	}
	return string(b)
}
