package main_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

type emitOut struct {
	Inserted int64 `json:"inserted"`
}

func TestEmitCommand(t *testing.T) {
	t.Parallel()
	dbURL, pool := testkit.NewOutbox(t)
	env := adminEnv(dbURL)

	code, stdout, stderr := runOnce(t, env, "emit")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "inserted 1 event\n", stdout)
	require.Equal(t, int64(1), testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE aggregate_type = 'demo'
		AND aggregate_id = '1' AND event_type = 'emitted' AND payload = '{"demo": true, "n": 1}' AND status = 'pending'`))

	var out emitOut
	runJSON(t, env, &out, "emit", "--count=5", "--aggregate-type=order", "--aggregate-id=42", "--event-type=created",
		`--payload={"total": 99.5}`, "--exchange=orders", "--routing-key=order.created.eu")
	require.Equal(t, int64(5), out.Inserted)
	require.Equal(t, int64(5), testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE aggregate_type = 'order'
		AND aggregate_id = '42' AND event_type = 'created' AND payload = '{"total": 99.5}'
		AND exchange = 'orders' AND routing_key = 'order.created.eu'`))

	start := time.Now()
	runJSON(t, env, &out, "emit", "--count=6", "--rate=10", "--event-type=paced")
	require.Equal(t, int64(6), out.Inserted)
	require.GreaterOrEqual(t, time.Since(start), 500*time.Millisecond, "six events at 10/s, the first at once")
	require.Equal(t, []any{int64(6), int64(6)}, []any{
		testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE event_type = 'paced'`),
		testkit.QueryInt(t, pool, `SELECT count(DISTINCT payload->>'n') FROM outbox WHERE event_type = 'paced'`),
	})

	// A rate without a count runs until SIGTERM, then says what it inserted.
	p := testkit.StartProcess(t, binary, env, "emit", "--rate=100", "--event-type=endless")
	testkit.WaitFor(t, 30*time.Second, "endless events", func() bool {
		return testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE event_type = 'endless'`) >= 10
	})
	p.Stop(30 * time.Second)
	n := testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE event_type = 'endless'`)
	require.Contains(t, p.Out.String(), "inserted "+itoa(n)+" events\n")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
