package notify

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/redact"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// Fast reconnects keep the tests short.
const (
	testReconnectMin = 20 * time.Millisecond
	testReconnectMax = 200 * time.Millisecond
	eventTimeout     = 10 * time.Second // generous: -race on a busy machine
)

// harness is a running Listener and what the test observes of it.
type harness struct {
	l         *Listener
	listening chan uint32 // the backend pid after every successful LISTEN
	logs      *testkit.Buffer
	stop      func() // cancels Run and awaits its return; the test's end does too
}

// start runs a Listener on cfg (with fast reconnects and a debug logger
// into h.logs unless cfg says otherwise) until the test ends.
func start(t *testing.T, cfg Config) *harness {
	t.Helper()
	h := &harness{listening: make(chan uint32, 100), logs: &testkit.Buffer{}}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if cfg.ReconnectMin == 0 {
		cfg.ReconnectMin, cfg.ReconnectMax = testReconnectMin, testReconnectMax
	}
	l, err := New(cfg)
	require.NoError(t, err)
	l.onListening = func(pid uint32) {
		select {
		case h.listening <- pid:
		default:
		}
	}
	h.l = l

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	var once sync.Once
	h.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(eventTimeout):
				t.Errorf("Run did not return within %s of cancel", eventTimeout)
			}
		})
	}
	t.Cleanup(func() {
		h.stop()
		if t.Failed() {
			t.Logf("listener logs:\n%s", h.logs.String())
		}
	})
	return h
}

// awaitWake fails the test unless a wake-up arrives within timeout.
func (h *harness) awaitWake(t *testing.T, why string) {
	t.Helper()
	select {
	case <-h.l.C():
	case <-time.After(eventTimeout):
		t.Fatalf("no wake-up (%s) within %s", why, eventTimeout)
	}
}

// awaitListening waits for the next successful LISTEN and returns its
// backend pid.
func (h *harness) awaitListening(t *testing.T) uint32 {
	t.Helper()
	select {
	case pid := <-h.listening:
		return pid
	case <-time.After(eventTimeout):
		t.Fatalf("listener not listening within %s", eventTimeout)
		return 0
	}
}

// drain takes any pending wake-up and reports whether there was one.
func (h *harness) drain() bool {
	select {
	case <-h.l.C():
		return true
	default:
		return false
	}
}

// countLogs counts log lines containing msg.
func (h *harness) countLogs(msg string) int {
	return strings.Count(h.logs.String(), msg)
}

// database is a fresh database, a pool on it (direct, never proxied) and
// a listener config for it.
func database(t *testing.T) (string, *pgxpool.Pool, Config) {
	t.Helper()
	dbURL := testkit.NewDatabase(t)
	pool := testkit.NewPool(t, dbURL)
	return dbURL, pool, Config{ConnConfig: parseConfig(t, dbURL), Channel: "outbox"}
}

// proxied returns dbURL rewritten to go through a new fault-injecting
// proxy.
func proxied(t *testing.T, dbURL string) (string, *testkit.Proxy) {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	proxy := testkit.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	return u.String(), proxy
}

func backendAlive(t *testing.T, pool *pgxpool.Pool, pid uint32) bool {
	return testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = $1 AND pid = $2`, ApplicationName, int64(pid)) == 1
}

func TestWakesOnNotify(t *testing.T) {
	t.Parallel()
	_, pool, cfg := database(t)
	h := start(t, cfg)
	h.awaitListening(t)
	h.drain()

	testkit.Exec(t, pool, "NOTIFY outbox")
	h.awaitWake(t, "NOTIFY outbox")

	// pg_notify with any payload, as often as it comes.
	for range 3 {
		testkit.Exec(t, pool, "SELECT pg_notify('outbox', 'anything')")
		h.awaitWake(t, "pg_notify")
	}
}

func TestWakesOnStart(t *testing.T) {
	t.Parallel()
	dbURL, _, cfg := database(t)
	// The database is unreachable: the first pass must not wait for it.
	proxyURL, proxy := proxied(t, dbURL)
	proxy.Cut()
	cfg.ConnConfig = parseConfig(t, proxyURL)
	h := start(t, cfg)
	h.awaitWake(t, "start")
}

func TestRunRejectsSecondCall(t *testing.T) {
	t.Parallel()
	_, _, cfg := database(t)
	h := start(t, cfg)
	h.awaitListening(t)
	err := h.l.Run(context.Background())
	require.ErrorContains(t, err, "notify: run: already running")
}

func TestCoalescesBursts(t *testing.T) {
	t.Parallel()
	_, pool, cfg := database(t)
	h := start(t, cfg)
	h.awaitListening(t)
	h.drain()

	// 1000 distinct notifications (identical ones would be folded into one
	// by PostgreSQL within a transaction).
	const n = 1000
	testkit.Exec(t, pool, "SELECT pg_notify('outbox', g::text) FROM generate_series(1, $1) g", n)
	testkit.WaitFor(t, eventTimeout, "all notifications handled", func() bool { return h.l.notified.Load() == n })

	wakes := 0
	for h.drain() {
		wakes++
	}
	require.Equal(t, 1, wakes, "a burst of %d notifications is one wake-up", n)
}

func TestSignalsCountsTheWakeUpsCFolds(t *testing.T) {
	t.Parallel()
	_, pool, cfg := database(t)
	h := start(t, cfg)
	h.awaitListening(t)
	h.drain()
	before := h.l.Signals()

	testkit.Exec(t, pool, "SELECT pg_notify('outbox', g::text) FROM generate_series(1, 3) g")
	testkit.WaitFor(t, eventTimeout, "three notifications handled", func() bool { return h.l.notified.Load() == 3 })
	require.True(t, h.drain(), "no wake-up on C")
	require.False(t, h.drain(), "C held more than one wake-up")
	require.Equal(t, before+3, h.l.Signals(), "a wake-up folded into the pending one is still counted")
}

func TestIgnoresOtherChannels(t *testing.T) {
	t.Parallel()
	_, pool, cfg := database(t)
	cfg.Pinger = pool
	cfg.PingInterval = time.Hour // the barrier below is the only heartbeat
	h := start(t, cfg)
	h.awaitListening(t)
	h.drain()

	testkit.Exec(t, pool, "NOTIFY outbox_other")
	testkit.Exec(t, pool, `NOTIFY "Outbox"`)
	// A barrier: notifications reach the listening connection in commit
	// order, so once this one is handled the two above have been too.
	const barrier = 1_000_000
	testkit.Exec(t, pool, "SELECT pg_notify($1, $2)", h.l.pingChannel, "1000000")
	testkit.WaitFor(t, eventTimeout, "barrier handled", func() bool { return h.l.pongSeq.Load() == barrier })
	require.False(t, h.drain(), "a notification on another channel woke the listener")
	require.Zero(t, h.l.notified.Load())
}

func TestReconnectsAfterTerminate(t *testing.T) {
	t.Parallel()
	_, pool, cfg := database(t)
	h := start(t, cfg)
	pid := h.awaitListening(t)
	require.True(t, backendAlive(t, pool, pid), "listener backend %d in pg_stat_activity", pid)
	h.drain()

	testkit.Exec(t, pool, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = $1`, ApplicationName)

	newPID := h.awaitListening(t)
	require.NotEqual(t, pid, newPID)
	require.True(t, backendAlive(t, pool, newPID), "new listener backend %d in pg_stat_activity", newPID)
	h.awaitWake(t, "catch-up after reconnect")
	require.Equal(t, 1, h.countLogs("listener reconnected"))

	h.drain()
	testkit.Exec(t, pool, "NOTIFY outbox")
	h.awaitWake(t, "NOTIFY after reconnect")
}

func TestHeartbeatReplacesSilentConnection(t *testing.T) {
	t.Parallel()
	dbURL, pool, cfg := database(t)
	proxyURL, proxy := proxied(t, dbURL)
	cfg.ConnConfig = parseConfig(t, proxyURL)
	cfg.Pinger = pool // direct, not through the proxy
	cfg.PingInterval = 200 * time.Millisecond
	cfg.PingTimeout = 500 * time.Millisecond
	cfg.ConnectTimeout = time.Second // attempts into the black hole give up
	h := start(t, cfg)
	pid := h.awaitListening(t)

	// A healthy connection answers its heartbeats and is kept.
	testkit.WaitFor(t, eventTimeout, "three heartbeats answered", func() bool { return h.l.pongSeq.Load() >= 3 })
	require.Empty(t, h.listening, "reconnected although the heartbeat was answered")
	require.True(t, backendAlive(t, pool, pid))

	// A silent partition: nothing is closed, nothing gets through. Only the
	// heartbeat can notice; when it does, the listener closes its side and
	// the proxy closes the backend's.
	proxy.Blackhole()
	testkit.WaitFor(t, eventTimeout, "listener abandons the silent connection", func() bool {
		return !backendAlive(t, pool, pid)
	})
	require.GreaterOrEqual(t, h.countLogs("listener heartbeat timed out"), 1)
	h.drain()

	proxy.Heal()
	newPID := h.awaitListening(t)
	require.NotEqual(t, pid, newPID)
	h.awaitWake(t, "catch-up after reconnect")

	h.drain()
	testkit.Exec(t, pool, "NOTIFY outbox")
	h.awaitWake(t, "NOTIFY after reconnect")
}

func TestHeartbeatRestsWhileNotificationsArrive(t *testing.T) {
	t.Parallel()
	_, pool, cfg := database(t)
	cfg.Pinger = pool
	cfg.PingInterval = 300 * time.Millisecond
	h := start(t, cfg)
	h.awaitListening(t)
	testkit.WaitFor(t, eventTimeout, "a heartbeat answered", func() bool { return h.l.pongSeq.Load() >= 1 })

	// Notifications every 10 ms for about seven intervals: each interval
	// has heard one, so none needs a heartbeat (one may be under way as
	// they start).
	ctx, cancel := context.WithCancel(context.Background())
	notifying := make(chan struct{})
	go func() {
		defer close(notifying)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for ctx.Err() == nil {
			_, _ = pool.Exec(ctx, "NOTIFY outbox")
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
	}()
	defer func() { cancel(); <-notifying }()
	from := h.l.notified.Load()
	pings := h.l.pingSeq.Load()
	testkit.WaitFor(t, eventTimeout, "200 notifications handled", func() bool { return h.l.notified.Load() >= from+200 })
	require.LessOrEqual(t, h.l.pingSeq.Load()-pings, uint64(2), "heartbeats sent while notifications proved the connection")

	// Once they stop, the heartbeat resumes.
	cancel()
	<-notifying
	pings = h.l.pingSeq.Load()
	testkit.WaitFor(t, eventTimeout, "heartbeats again", func() bool { return h.l.pongSeq.Load() >= pings+2 })
}

func TestRetriesUntilReachable(t *testing.T) {
	t.Parallel()
	dbURL, pool, cfg := database(t)
	proxyURL, proxy := proxied(t, dbURL)
	proxy.Cut()
	cfg.ConnConfig = parseConfig(t, proxyURL)
	h := start(t, cfg)
	h.awaitWake(t, "start")

	testkit.WaitFor(t, eventTimeout, "three failed connects", func() bool {
		return h.countLogs("listener connect failed") >= 3
	})
	require.Empty(t, h.listening)
	require.Contains(t, h.logs.String(), "level=WARN msg=\"listener connect failed\"")
	require.Contains(t, h.logs.String(), "err=")

	proxy.Restore()
	h.awaitListening(t)
	h.awaitWake(t, "catch-up after connecting")

	h.drain()
	testkit.Exec(t, pool, "NOTIFY outbox")
	h.awaitWake(t, "NOTIFY after connecting")
}

// The listener logs every failed connect with its error, and an error may
// quote the password: here a server (think of a proxy or pooler in front
// of PostgreSQL) asks for it in clear text and refuses it with a message
// that repeats it. The log line carries the server's message with the
// password masked, whether the password came in the URL or was set on the
// connection config alone (as a password file or PGPASSWORD sets it).
func TestNeverLogsPassword(t *testing.T) {
	t.Parallel()
	const password = "s3cr3t/n0t in the l0gs"
	addr := passwordEchoServer(t)
	inURL := parseConfig(t, (&url.URL{Scheme: "postgres", User: url.UserPassword("relay", password),
		Host: addr, Path: "/db", RawQuery: "sslmode=disable"}).String())
	onConfig := parseConfig(t, "postgres://relay@"+addr+"/db?sslmode=disable")
	onConfig.Password = password
	for name, cc := range map[string]*pgx.ConnConfig{"in the URL": inURL, "on the config": onConfig} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := start(t, Config{ConnConfig: cc, Channel: "outbox"})
			testkit.WaitFor(t, eventTimeout, "failed connects logged", func() bool {
				return h.countLogs("listener connect failed") >= 2
			})
			logs := h.logs.String()
			require.Contains(t, logs, "password authentication failed", "the server's message is logged")
			require.Contains(t, logs, redact.Mask+`\" is not the password`, "the password in it is masked")
			for _, form := range []string{password, url.PathEscape(password), url.QueryEscape(password), "s3cr3t"} {
				require.NotContains(t, logs, form)
			}
		})
	}
}

// passwordEchoServer listens on a port of its own and speaks PostgreSQL's
// protocol as far as authentication: it asks each client for its password
// in clear text and refuses it with an error that quotes it. It returns
// its address.
func passwordEchoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(eventTimeout))
				refusePassword(conn)
			})
		}
	})
	return ln.Addr().String()
}

func refusePassword(conn net.Conn) {
	be := pgproto3.NewBackend(conn, conn)
	if msg, err := be.ReceiveStartupMessage(); err != nil {
		return
	} else if _, ok := msg.(*pgproto3.StartupMessage); !ok {
		return
	}
	be.Send(&pgproto3.AuthenticationCleartextPassword{})
	if be.Flush() != nil || be.SetAuthType(pgproto3.AuthTypeCleartextPassword) != nil {
		return
	}
	msg, err := be.Receive()
	if err != nil {
		return
	}
	pw, ok := msg.(*pgproto3.PasswordMessage)
	if !ok {
		return
	}
	be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", Code: "28P01",
		Message: fmt.Sprintf("password authentication failed: %q is not the password", pw.Password)})
	_ = be.Flush()
}

func TestConnectedFollowsTheListeningConnection(t *testing.T) {
	t.Parallel()
	dbURL, _, cfg := database(t)
	proxyURL, proxy := proxied(t, dbURL)
	cfg.ConnConfig = parseConfig(t, proxyURL)
	h := start(t, cfg)
	h.awaitListening(t)
	require.True(t, h.l.Connected())

	proxy.Cut() // the connection drops, and reconnecting fails
	testkit.WaitFor(t, eventTimeout, "the listener to see its connection gone", func() bool { return !h.l.Connected() })
	proxy.Restore()
	h.awaitListening(t)
	require.True(t, h.l.Connected())
}
