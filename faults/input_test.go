//go:build faults

package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// oddRow is an unusual or poisonous outbox row.
type oddRow struct {
	name                   string
	eventType, aggregateID string
	payload, headers       string
	exchange, routingKey   *string
	delivered              bool // else dead-lettered
	// invalid: dead-lettered on its first attempt, as a message that can
	// never be published, with this in its last error.
	invalid string
}

// oddRows are the rows of scenario 8; aggregate ids tell them apart.
func oddRows(t *testing.T) []oddRow {
	str := func(s string) *string { return &s }
	big, err := json.Marshal(map[string]string{"blob": strings.Repeat("x", 5<<20)})
	require.NoError(t, err)
	// 2,000 keys of 100 bytes: 221 kB of AMQP headers, more than one frame
	// (RabbitMQ's frame_max, 128 KiB), which RabbitMQ answered by closing
	// the connection under every batch in flight.
	wide := make(map[string]string, 2000)
	for i := range 2000 {
		wide[fmt.Sprintf("%0100d", i)] = "v"
	}
	wideHeaders, err := json.Marshal(wide)
	require.NoError(t, err)
	return []oddRow{
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
		{name: "headers larger than a frame", eventType: "odd", aggregateID: "9", payload: `{}`, headers: string(wideHeaders),
			invalid: "more than the connection's frame size"},
	}
}

// Scenario 8: odd and poisonous rows, shuffled, each at a random point
// among 4,000 ordinary ones. Each fails, if it must, alone: never its
// batch, the channel or the relay; the rest are delivered once. Three
// times, each in a fresh outbox.
func TestPoisonAndOddInput(t *testing.T) {
	r := rng(t)
	o := outcome{Scenario: "8 poison and odd input among ordinary rows"}
	const (
		tag      = "ordinary"
		ordinary = 4000
	)
	rows := oddRows(t)
	for range 3 {
		w := newWorld(t)
		order := r.Perm(len(rows))
		cuts := faultPoints(r, len(rows), 0, ordinary)
		inserted := 0
		for k, i := range order {
			w.insert(tag, cuts[k]-inserted)
			inserted = cuts[k]
			insertOdd(t, w, rows[i])
		}
		w.insert(tag, ordinary-inserted)
		started := w.ended(tag)
		p := w.relay("--max-attempts=2", "--retry-min=100ms", "--retry-max=200ms", "--poll-interval=200ms")
		w.settle(&o, tag, ordinary, started)
		checkOdd(t, w, rows)
		p.Stop(time.Minute)
		require.NotContains(t, p.Out.String(), "panic")
		for _, r := range rows {
			o.Committed++
			if r.delivered {
				o.Delivered++
			} else {
				o.DeadLettered++
			}
		}
		o.Faults += len(rows)
	}
	record(o)
	require.Zero(t, o.Lost)
}

// insertOdd commits one odd row.
func insertOdd(t *testing.T, w *world, r oddRow) {
	t.Helper()
	var headers any
	if r.headers != "" {
		headers = r.headers
	}
	testkit.Exec(t, w.pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers, exchange, routing_key)
		VALUES ('odd', $1, $2, $3::jsonb, $4::jsonb, $5, $6)`, r.aggregateID, r.eventType, r.payload, headers, r.exchange, r.routingKey)
}

// checkOdd waits until every odd row is settled and checks each one's
// fate: published and delivered once, or dead-lettered with its reason.
func checkOdd(t *testing.T, w *world, rows []oddRow) {
	t.Helper()
	testkit.WaitFor(t, time.Minute, "every odd row settled", func() bool {
		return testkit.QueryInt(t, w.pool, `SELECT count(*) FROM outbox WHERE aggregate_type = 'odd' AND status = 'pending'`) == 0
	})
	for _, r := range rows {
		var (
			status, lastError string
			attempts          int
		)
		require.NoError(t, w.pool.QueryRow(context.Background(),
			`SELECT status, coalesce(last_error, ''), attempts FROM outbox WHERE aggregate_type = 'odd' AND aggregate_id = $1`, r.aggregateID).Scan(&status, &lastError, &attempts))
		want := "failed"
		if r.delivered {
			want = "published"
		} else {
			require.NotEmpty(t, lastError, "%s: dead-lettered without a reason", r.name)
		}
		require.Equal(t, want, status, "%s: %s", r.name, lastError)
		if r.invalid != "" {
			require.Contains(t, lastError, r.invalid, "%s: dead-lettered for another reason", r.name)
			require.Equal(t, 1, attempts, "%s: not dead-lettered at once: %s", r.name, lastError)
		}
	}
	for _, typ := range []string{"big", "null", "headers", "créé-✓", ""} {
		w.count.waitDistinct(t, typ, 1, time.Minute)
		d, dups := w.count.stats(typ)
		require.Equal(t, 1, d, "event type %q", typ)
		require.Zero(t, dups, "event type %q", typ)
	}
}
