package main_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// statusOut is the JSON of outboxrelay status.
type statusOut struct {
	Table                   string   `json:"table"`
	Pending                 int64    `json:"pending"`
	Published               int64    `json:"published"`
	Failed                  int64    `json:"failed"`
	InFlight                int64    `json:"in_flight"`
	Retrying                int64    `json:"retrying"`
	OldestPendingAgeSeconds *float64 `json:"oldest_pending_age_seconds"`
	FailedByEventType       []struct {
		EventType string `json:"event_type"`
		Count     int64  `json:"count"`
	} `json:"failed_by_event_type"`
	Blocked *struct {
		Aggregates int64 `json:"aggregates"`
		Waiting    int64 `json:"waiting"`
		First      []struct {
			Key       []string `json:"key"`
			FailedID  int64    `json:"failed_id"`
			EventType string   `json:"event_type"`
			Waiting   int64    `json:"waiting"`
		} `json:"first"`
	} `json:"blocked"`
}

func TestStatusCommand(t *testing.T) {
	t.Parallel()
	dbURL, pool := testkit.NewOutbox(t)
	env := adminEnv(dbURL)

	code, stdout, stderr := runOnce(t, env, "status", "--json")
	require.Equal(t, 0, code, stderr)
	require.JSONEq(t, `{"table": "outbox", "pending": 0, "published": 0, "failed": 0, "in_flight": 0, "retrying": 0,
		"scheduled": 0, "oldest_pending_age_seconds": null, "failed_by_event_type": [], "blocked": null}`, stdout)

	seedOutbox(t, pool, [][3]string{
		{"pending", "1", "created"}, // ten minutes old
		{"failed", "1", "paid"},
		{"pending", "1", "shipped"},
		{"published", "2", "created"},
		{"failed", "3", "created"},
		{"failed", "4", "paid"},
		{"pending", "5", "created"},
		{"pending", "6", "created"},
		{"published", "6", "shipped"},
		{"pending", "7", "created"},
		{"published", "7", "shipped"},
	})
	testkit.Exec(t, pool, `UPDATE outbox SET lease_id = gen_random_uuid(), available_at = now() + interval '30 seconds' WHERE aggregate_id = '5'`)
	testkit.Exec(t, pool, `UPDATE outbox SET attempts = 3, available_at = now() + interval '5 minutes' WHERE aggregate_id IN ('6', '7') AND status = 'pending'`)

	var s statusOut
	runJSON(t, env, &s, "status")
	require.Equal(t, "outbox", s.Table)
	require.Equal(t, [5]int64{5, 3, 3, 1, 2}, [5]int64{s.Pending, s.Published, s.Failed, s.InFlight, s.Retrying})
	require.NotNil(t, s.OldestPendingAgeSeconds)
	require.InDelta(t, 600, *s.OldestPendingAgeSeconds, 60)
	require.Len(t, s.FailedByEventType, 2)
	require.Equal(t, "paid", s.FailedByEventType[0].EventType)
	require.Equal(t, int64(2), s.FailedByEventType[0].Count)
	require.Nil(t, s.Blocked, "unordered")

	// Ordered, blocking: order/1's head (its first pending or failed event)
	// is pending; order/3 and order/4 are dead-lettered heads.
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', '3', 'paid', '{}'), ('order', '3', 'shipped', '{}')`)
	runJSON(t, env, &s, "status", "--ordering=aggregate")
	require.NotNil(t, s.Blocked)
	require.Equal(t, int64(2), s.Blocked.Aggregates)
	require.Equal(t, int64(2), s.Blocked.Waiting)
	require.Len(t, s.Blocked.First, 2)
	require.Equal(t, []string{"order", "3"}, s.Blocked.First[0].Key)
	require.Equal(t, int64(2), s.Blocked.First[0].Waiting)
	require.Equal(t, testkit.QueryInt(t, pool, `SELECT id FROM outbox WHERE aggregate_id = '3' AND status = 'failed'`), s.Blocked.First[0].FailedID)
	require.Equal(t, []string{"order", "4"}, s.Blocked.First[1].Key)
	s.Blocked = nil
	runJSON(t, env, &s, "status", "--ordering=aggregate", "--ordered-dead-letter=continue")
	require.Nil(t, s.Blocked, "under continue no aggregate waits")

	code, stdout, stderr = runOnce(t, env, "status", "--ordering=aggregate")
	require.Equal(t, 0, code, stderr)
	for _, want := range []string{"pending    7", "oldest 10m", "1 in flight, 2 waiting to retry, 0 scheduled", "published  3", "failed     3",
		"paid        2", "Blocked aggregates: 2, 2 events waiting", "order/3"} {
		require.Contains(t, stdout, want)
	}
	require.Empty(t, stderr, "nothing but data")
}

func TestAdminCommandsExitTwoOnBadConfiguration(t *testing.T) {
	t.Parallel()
	dbURL, _ := testkit.NewOutbox(t)
	standbyURL, _ := testkit.NewOutbox(t)
	readOnly(t, standbyURL, true) // what a standby is to a new session
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"only a standby answering", adminEnv(multiHost(t, standbyURL)), []string{"requeue", "--all"}, "no server of the URL takes writes"},
		{"a standby asked for", adminEnv(testkit.WithParam(dbURL, "target_session_attrs=standby")), []string{"status"}, "target_session_attrs=standby"},
		{"missing table", adminEnv(dbURL), []string{"status", "--table=nope"}, "--table nope"},
		{"missing schema", adminEnv(dbURL), []string{"dead", "--table=nope.outbox"}, "--table nope.outbox"},
		{"missing column", adminEnv(dbURL), []string{"dead", "--column-event-type=kind"}, "--column-*"},
		{"bad status value", adminEnv(dbURL), []string{"status", "--status-failed=it's"}, "Statuses.Failed"},
		{"unreachable database", adminEnv("postgres://u:s3cret@127.0.0.1:1/db?connect_timeout=5"), []string{"status"}, "PostgreSQL"},
		{"negative limit", adminEnv(dbURL), []string{"dead", "--limit=-1"}, "--limit"},
		{"bad payload", adminEnv(dbURL), []string{"emit", "--payload={"}, "--payload"},
		{"bad table name", adminEnv(dbURL), []string{"sql", "--table=a.b.c"}, "a.b.c"},
		{"long channel", adminEnv(dbURL), []string{"requeue", "--all", "--channel=" + strings.Repeat("c", 64)}, "--channel"},
		{"zero query timeout", adminEnv(dbURL), []string{"status", "--query-timeout=0s"}, "--query-timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runOnce(t, tc.env, tc.args...)
			require.Equal(t, 2, code, stderr)
			require.Empty(t, stdout)
			require.Contains(t, stderr, tc.want)
			require.NotContains(t, stderr, "s3cret")
		})
	}
}

// The read-only subcommands need no more than the relay's least-privilege
// role grants; requeue neither. emit inserts, which the role may not: a
// failure, exit code 1.
func TestAdminCommandsAsLeastPrivilegeRole(t *testing.T) {
	t.Parallel()
	dbURL, pool := testkit.NewOutbox(t)
	seedOutbox(t, pool, [][3]string{{"pending", "1", "created"}, {"failed", "2", "created"}, {"published", "3", "created"}})
	env := adminEnv(leastPrivilegeURL(t, dbURL, pool))

	var s statusOut
	runJSON(t, env, &s, "status", "--ordering=aggregate")
	require.Equal(t, [3]int64{1, 1, 1}, [3]int64{s.Pending, s.Published, s.Failed})
	require.NotNil(t, s.Blocked)
	require.Equal(t, int64(1), s.Blocked.Aggregates)

	var dead []deadOut
	runJSON(t, env, &dead, "dead")
	require.Len(t, dead, 1)
	require.Equal(t, "2", dead[0].AggregateID)

	var rq requeueOut
	runJSON(t, env, &rq, "requeue", "--all")
	require.Equal(t, int64(1), rq.Requeued)
	require.Zero(t, testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE status = 'failed'`))

	code, _, stderr := runOnce(t, env, "emit")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "permission denied")

	// On a drop-in table as well.
	d := newDropInTable(t)
	testkit.Exec(t, d.Pool, `INSERT INTO app_events (entity_type, entity_id, kind, body, state, last_error) VALUES ('user', '1', 'signed_up', '{}', 'DEAD', 'boom')`)
	env = adminEnv(leastPrivilegeURL(t, d.URL, d.Pool, "-v", "table=app_events", "-v", "id_column=seq"))
	runJSON(t, env, &s, d.args("status")...)
	require.Equal(t, int64(1), s.Failed)
	runJSON(t, env, &dead, d.args("dead")...)
	require.Len(t, dead, 1)
	require.Equal(t, "signed_up", dead[0].EventType)
}

// Every subcommand on a table of a team's own: other column names, other
// status values, ordered by its own key.
func TestAdminCommandsOnDropInTable(t *testing.T) {
	t.Parallel()
	d := newDropInTable(t)
	env := adminEnv(d.URL)

	var emitted struct {
		Inserted int64 `json:"inserted"`
	}
	runJSON(t, env, &emitted, d.args("emit", "--count=3", "--aggregate-type=user", "--aggregate-id=7", "--event-type=signed_up")...)
	require.Equal(t, int64(3), emitted.Inserted)
	require.Equal(t, int64(3), testkit.QueryInt(t, d.Pool, `SELECT count(*) FROM app_events
		WHERE entity_type = 'user' AND entity_id = '7' AND kind = 'signed_up' AND state = 'NEW' AND (body->>'demo')::boolean`))
	// The first event of user/7 is dead-lettered: the aggregate is blocked.
	testkit.Exec(t, d.Pool, `UPDATE app_events SET state = 'DEAD', attempts = 25, last_error = 'no route', occurred_at = now() - interval '2 hours'
		WHERE seq = (SELECT min(seq) FROM app_events)`)
	testkit.Exec(t, d.Pool, `INSERT INTO app_events (entity_type, entity_id, kind, body, state) VALUES ('user', '8', 'signed_up', '{}', 'SENT')`)

	var s statusOut
	runJSON(t, env, &s, d.args("status")...)
	require.Equal(t, "public.app_events", s.Table)
	require.Equal(t, [3]int64{2, 1, 1}, [3]int64{s.Pending, s.Published, s.Failed})
	require.Equal(t, "signed_up", s.FailedByEventType[0].EventType)
	require.NotNil(t, s.Blocked)
	require.Equal(t, int64(1), s.Blocked.Aggregates)
	require.Equal(t, int64(2), s.Blocked.Waiting)
	require.Equal(t, []string{"user", "7"}, s.Blocked.First[0].Key)

	var dead []deadOut
	runJSON(t, env, &dead, d.args("dead", "--older-than=1h")...)
	require.Len(t, dead, 1)
	require.Equal(t, testkit.QueryInt(t, d.Pool, `SELECT min(seq) FROM app_events`), dead[0].ID)
	var uid string
	require.NoError(t, d.Pool.QueryRow(t.Context(), `SELECT uid::text FROM app_events WHERE state = 'DEAD'`).Scan(&uid))
	require.Equal(t, uid, dead[0].EventID, "the table's own uuid")
	require.Equal(t, "no route", *dead[0].LastError)
	require.WithinDuration(t, time.Now().Add(-2*time.Hour), dead[0].CreatedAt, time.Minute)

	var rq requeueOut
	runJSON(t, env, &rq, d.args("requeue", "--dry-run", "--event-type=signed_up")...)
	require.Equal(t, int64(1), rq.Matched)
	require.Zero(t, rq.Requeued)
	runJSON(t, env, &rq, d.args("requeue", "--id", strconv.FormatInt(dead[0].ID, 10))...)
	require.Equal(t, []int64{dead[0].ID}, rq.IDs)
	require.Equal(t, int64(3), testkit.QueryInt(t, d.Pool, `SELECT count(*) FROM app_events WHERE state = 'NEW' AND attempts = 0`))
	runJSON(t, env, &s, d.args("status")...)
	require.Zero(t, s.Blocked.Aggregates)
}
