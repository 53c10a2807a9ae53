package main_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// deadOut is one event of outboxrelay dead --json.
type deadOut struct {
	ID            int64     `json:"id"`
	EventID       string    `json:"event_id"`
	AggregateType string    `json:"aggregate_type"`
	AggregateID   string    `json:"aggregate_id"`
	EventType     string    `json:"event_type"`
	Exchange      *string   `json:"exchange"`
	RoutingKey    *string   `json:"routing_key"`
	Attempts      int       `json:"attempts"`
	LastError     *string   `json:"last_error"`
	CreatedAt     time.Time `json:"created_at"`
}

func TestDeadCommand(t *testing.T) {
	t.Parallel()
	dbURL, pool := testkit.NewOutbox(t)
	env := adminEnv(dbURL)

	code, stdout, stderr := runOnce(t, env, "dead", "--json")
	require.Equal(t, 0, code, stderr)
	require.JSONEq(t, `[]`, stdout, "nothing dead-lettered: an empty array, exit code 0")

	seedOutbox(t, pool, [][3]string{
		{"failed", "1", "created"}, // five minutes old
		{"failed", "2", "paid"},
		{"pending", "3", "paid"},
		{"failed", "1", "paid"},
		{"published", "1", "shipped"},
		{"failed", "4", "created"},
	})
	testkit.Exec(t, pool, `UPDATE outbox SET exchange = 'late', routing_key = 'rk', last_error = E'line one\nline two' WHERE aggregate_id = '4'`)

	var all []deadOut
	runJSON(t, env, &all, "dead")
	require.Len(t, all, 4)
	var eventID string
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT event_id::text FROM outbox WHERE id = $1`, all[0].ID).Scan(&eventID))
	first := all[0]
	require.Equal(t, eventID, first.EventID)
	require.Equal(t, [3]string{"order", "1", "created"}, [3]string{first.AggregateType, first.AggregateID, first.EventType})
	require.Equal(t, 25, first.Attempts)
	require.Equal(t, "boom created", *first.LastError)
	require.Nil(t, first.Exchange)
	require.WithinDuration(t, time.Now().Add(-5*time.Minute), first.CreatedAt, time.Minute)
	require.Equal(t, "late", *all[3].Exchange)
	require.Equal(t, "rk", *all[3].RoutingKey)

	// Every key the JSON promises is there, null or not.
	var raw []map[string]json.RawMessage
	runJSON(t, env, &raw, "dead", "--limit=1")
	for _, key := range []string{"id", "event_id", "aggregate_type", "aggregate_id", "event_type", "attempts", "last_error", "created_at", "exchange", "routing_key"} {
		require.Contains(t, raw[0], key)
	}

	for _, tc := range []struct {
		args []string
		want []string // aggregate id:event type
	}{
		{[]string{"--event-type=paid"}, []string{"2:paid", "1:paid"}},
		{[]string{"--aggregate-type=order", "--aggregate-id=1"}, []string{"1:created", "1:paid"}},
		{[]string{"--aggregate-type=invoice"}, []string{}},
		{[]string{"--older-than=3m30s"}, []string{"1:created", "2:paid"}},
		{[]string{"--limit=2"}, []string{"1:created", "2:paid"}},
		{[]string{"--limit=0"}, []string{"1:created", "2:paid", "1:paid", "4:created"}},
	} {
		var got []deadOut
		stderr := runJSON(t, env, &got, append([]string{"dead"}, tc.args...)...)
		ids := []string{}
		for _, e := range got {
			ids = append(ids, e.AggregateID+":"+e.EventType)
		}
		require.Equal(t, tc.want, ids, tc.args)
		if tc.args[0] == "--limit=2" {
			require.Contains(t, stderr, "2 of 4 dead-lettered events listed")
		} else {
			require.Empty(t, stderr, tc.args)
		}
	}

	code, stdout, stderr = runOnce(t, env, "dead", "--aggregate-id=4")
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.Len(t, lines, 2, "a header and one event on one line:\n%s", stdout)
	require.Contains(t, lines[0], "LAST ERROR")
	require.Contains(t, lines[1], "order/4")
	require.Contains(t, lines[1], "line one line two")
}
