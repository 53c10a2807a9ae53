//go:build faults

package faults

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/testkit"
)

// Scenario 8: odd and poisonous rows among ordinary ones. Each fails, if it
// must, alone: never its batch, the channel or the relay.
func TestPoisonAndOddInput(t *testing.T) {
	w := newWorld(t)
	o := outcome{Scenario: "8 poison and odd input among ordinary rows"}
	const tag = "ordinary"
	type row struct {
		name                   string
		eventType, aggregateID string
		payload, headers       string
		exchange, routingKey   *string
		delivered              bool // else dead-lettered
	}
	str := func(s string) *string { return &s }
	big, err := json.Marshal(map[string]string{"blob": strings.Repeat("x", 5<<20)})
	require.NoError(t, err)
	rows := []row{
		{name: "routing key over 255 bytes", eventType: "odd", aggregateID: "1", payload: `{}`, routingKey: str(strings.Repeat("k", 256))},
		{name: "exchange that does not exist", eventType: "odd", aggregateID: "2", payload: `{}`, exchange: str(testkit.UniqueName("missing"))},
		{name: "payload of 5 MiB", eventType: "big", aggregateID: "3", payload: string(big), delivered: true},
		{name: "payload JSON null", eventType: "null", aggregateID: "4", payload: `null`, delivered: true},
		{name: "headers of every JSON type", eventType: "headers", aggregateID: "5", payload: `{}`, delivered: true,
			headers: `{"s": "x", "i": 42, "f": 1.5, "big": 123456789012345678901234567890, "t": true, "n": null, "a": [1, "two", [3], {"four": 4}], "o": {"nested": {"deeper": [null]}}}`},
		{name: "headers not an object", eventType: "odd", aggregateID: "6", payload: `{}`, headers: `[1, 2]`},
		{name: "non-ASCII everywhere", eventType: "créé-✓", aggregateID: "Ωμέγα-名前", payload: `{"text": "ünïcødé ✓ 名前 🚀"}`, delivered: true,
			headers: `{"clé": "valeur ✓", "名前": "🚀"}`},
		{name: "empty event type and aggregate id", eventType: "", aggregateID: "", payload: `{}`, delivered: true},
	}

	w.insert(tag, 2000)
	for _, r := range rows {
		var headers any
		if r.headers != "" {
			headers = r.headers
		}
		testkit.Exec(t, w.pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers, exchange, routing_key)
			VALUES ('odd', $1, $2, $3::jsonb, $4::jsonb, $5, $6)`, r.aggregateID, r.eventType, r.payload, headers, r.exchange, r.routingKey)
	}
	w.insert(tag, 2000)
	started := time.Now()
	p := w.relay("--max-attempts=2", "--retry-min=100ms", "--retry-max=200ms", "--poll-interval=200ms")

	w.settle(&o, tag, 4000, started)
	deliveredOdd := 0
	for _, r := range rows {
		if r.delivered {
			deliveredOdd++
		}
	}
	testkit.WaitFor(t, time.Minute, "every odd row settled", func() bool {
		return testkit.QueryInt(t, w.pool, `SELECT count(*) FROM outbox WHERE aggregate_type = 'odd' AND status = 'pending'`) == 0
	})
	for _, r := range rows {
		var status, lastError string
		require.NoError(t, w.pool.QueryRow(context.Background(),
			`SELECT status, coalesce(last_error, '') FROM outbox WHERE aggregate_type = 'odd' AND aggregate_id = $1`, r.aggregateID).Scan(&status, &lastError))
		want := "failed"
		if r.delivered {
			want = "published"
		}
		require.Equal(t, want, status, "%s: %s", r.name, lastError)
		t.Logf("%s: %s %s", r.name, status, lastError)
	}
	for _, typ := range []string{"big", "null", "headers", "créé-✓", ""} {
		d, _, _ := w.count.stats(typ)
		require.Equal(t, 1, d, "event type %q", typ)
	}
	p.Stop(time.Minute)
	require.NotContains(t, p.Out.String(), "panic")
	o.Committed += len(rows)
	o.Delivered += deliveredOdd
	o.DeadLettered += len(rows) - deliveredOdd
	record(o)
	require.Zero(t, o.Lost)
}
