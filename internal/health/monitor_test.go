package health_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/health"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

func get(t *testing.T, h http.Handler) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	var body map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	return rec.Code, body
}

func TestReadyzAnswersFromTheLastRoundOfChecks(t *testing.T) {
	var broken atomic.Bool
	var rounds atomic.Int64
	var ready atomic.Bool
	m, err := health.New(health.Config{
		Checks: []health.Check{
			{Name: "always", Run: func(context.Context) error { return nil }},
			{Name: "broker", Run: func(context.Context) error {
				if broken.Load() {
					return errors.New("not connected")
				}
				return nil
			}},
		},
		Interval: time.Millisecond,
		OnReady:  func(ok bool) { ready.Store(ok); rounds.Add(1) },
	})
	require.NoError(t, err)

	code, body := get(t, m.ReadyHandler())
	require.Equal(t, http.StatusServiceUnavailable, code, "not ready before the first round")
	require.Equal(t, "starting: not checked yet", body["reason"])

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	testkit.WaitFor(t, 5*time.Second, "a first round", func() bool { return rounds.Load() > 0 })
	code, body = get(t, m.ReadyHandler())
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, map[string]any{"ready": true}, body)

	broken.Store(true)
	testkit.WaitFor(t, 5*time.Second, "not ready", func() bool { return !ready.Load() })
	code, body = get(t, m.ReadyHandler())
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, map[string]any{"broker": "not connected"}, body["failing"])
	require.Equal(t, "broker: not connected", body["reason"])

	broken.Store(false)
	testkit.WaitFor(t, 5*time.Second, "ready again", func() bool { return ready.Load() })
	code, _ = get(t, m.ReadyHandler())
	require.Equal(t, http.StatusOK, code)
}

func TestLivezAsksOnlyTheRelay(t *testing.T) {
	var live atomic.Bool
	h := health.LiveHandler(live.Load)
	code, _ := get(t, h)
	require.Equal(t, http.StatusServiceUnavailable, code)
	live.Store(true)
	code, body := get(t, h)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, true, body["live"])
}

func TestNewNamesWhatIsMissing(t *testing.T) {
	_, err := health.New(health.Config{})
	require.ErrorContains(t, err, "Config.Checks")
	_, err = health.New(health.Config{Checks: []health.Check{{Name: "x"}}})
	require.ErrorContains(t, err, "Config.Checks[0]")
}

func TestACostlyCheckRunsOnlyEveryIntervalWhilePassing(t *testing.T) {
	var runs, rounds atomic.Int64
	var broken atomic.Bool
	m, err := health.New(health.Config{
		Checks: []health.Check{{Name: "table", Every: time.Hour, Run: func(context.Context) error {
			runs.Add(1)
			if broken.Load() {
				return errors.New("no outbox trigger")
			}
			return nil
		}}},
		Interval: time.Millisecond,
		OnReady:  func(bool) { rounds.Add(1) },
	})
	require.NoError(t, err)
	broken.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	// Failing, it runs every round.
	testkit.WaitFor(t, 5*time.Second, "ten rounds", func() bool { return rounds.Load() >= 10 })
	require.GreaterOrEqual(t, runs.Load(), int64(9))
	broken.Store(false)
	testkit.WaitFor(t, 5*time.Second, "ready", func() bool { return m.Status().Ready })
	// Passing, it runs no more within the hour.
	ran := runs.Load()
	seen := rounds.Load()
	testkit.WaitFor(t, 5*time.Second, "ten more rounds", func() bool { return rounds.Load() >= seen+10 })
	require.Equal(t, ran, runs.Load())
}

// Once the relay's shutdown begins (Run's context ends), the monitor stops
// checking the parts shutdown is stopping: /readyz answers "shutting down"
// and nothing is logged at Warn, though the checks now fail. Here the
// listener's check is under way when shutdown begins and fails because of
// it, as the listener stops: the round it belongs to must not report the
// relay not ready.
func TestShutdownIsNotReadyWithoutAWarning(t *testing.T) {
	var calls atomic.Int64
	checking := make(chan struct{}) // closed by the second check, under way
	logs := &testkit.Buffer{}
	m, err := health.New(health.Config{
		Checks: []health.Check{{Name: "listener", Run: func(ctx context.Context) error {
			if calls.Add(1) == 1 {
				return nil // the first round: ready
			}
			close(checking)
			<-ctx.Done() // shutdown begins; the listener stops
			return errors.New("not listening")
		}}},
		Interval: time.Millisecond,
		Timeout:  time.Hour, // the check ends with shutdown, not with its timeout
		Logger:   slog.New(slog.NewJSONHandler(logs, nil)),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- m.Run(ctx) }()
	select {
	case <-checking:
	case <-time.After(5 * time.Second):
		t.Fatal("no second round of checks within 5s")
	}
	code, _ := get(t, m.ReadyHandler())
	require.Equal(t, http.StatusOK, code, "ready after the first round")

	cancel()
	require.NoError(t, <-done)
	code, body := get(t, m.ReadyHandler())
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, map[string]any{"relay": "shutting down"}, body["failing"])
	require.Contains(t, logs.String(), `"msg":"ready"`, "the log is read: it holds the first round's line")
	require.NotContains(t, logs.String(), `"level":"WARN"`)
}
