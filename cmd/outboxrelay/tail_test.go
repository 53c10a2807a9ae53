package main_test

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// tailEnv is the environment of outboxrelay tail: the local RabbitMQ and
// the exchange.
func tailEnv(exchange string) []string {
	return []string{"PATH=" + os.Getenv("PATH"), "AMQP_URL=" + testkit.AMQPURL(), "OUTBOX_EXCHANGE=" + exchange}
}

// startTail starts outboxrelay tail and waits until its queue is bound.
func startTail(t *testing.T, env []string, args ...string) *testkit.Process {
	t.Helper()
	p := testkit.StartProcess(t, binary, env, append([]string{"tail"}, args...)...)
	p.AwaitOutput(30*time.Second, "tail to bind its queue", func(out string) bool {
		return strings.Contains(out, "waiting for messages")
	})
	return p
}

// publishRaw publishes one message to exchange as another application
// would.
func publishRaw(t *testing.T, exchange, routingKey string, msg amqp.Publishing) {
	t.Helper()
	conn, err := amqp.Dial(testkit.AMQPURL())
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, ch.PublishWithContext(ctx, exchange, routingKey, false, false, msg))
}

// The quick start's path: an event written to the outbox is relayed, and
// tail prints it as a queue bound to the exchange received it: its
// routing key, the event's id as message id, its headers and its payload.
func TestTailPrintsTheEventsTheRelayPublishes(t *testing.T) {
	t.Parallel()
	url, pool := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	q := testkit.NewQueue(t, exchange, "#")
	startRelay(t, relayEnv(url, exchange))
	tail := startTail(t, tailEnv(exchange), "--json", "--count=1")

	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers)
		VALUES ('order', '42', 'created', '{"total": 9.5, "items": ["a"]}', '{"tenant": "acme"}')`)
	d := q.Receive(t, 1, 30*time.Second)[0]
	select {
	case <-tail.Done():
		require.NoError(t, tail.Err(), tail.Out.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("tail --count=1 did not exit after the event arrived:\n%s", tail.Out.String())
	}

	var line struct {
		Exchange   string          `json:"exchange"`
		RoutingKey string          `json:"routing_key"`
		MessageID  string          `json:"message_id"`
		Headers    map[string]any  `json:"headers"`
		Body       json.RawMessage `json:"body"`
	}
	out := tail.Out.String()
	jsonLine := out[strings.Index(out, "{"):]
	require.NoError(t, json.Unmarshal([]byte(jsonLine), &line), out)
	var eventID string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT event_id::text FROM outbox`).Scan(&eventID))
	require.Equal(t, exchange, line.Exchange)
	require.Equal(t, d.RoutingKey, line.RoutingKey)
	require.Equal(t, "order.created", line.RoutingKey)
	require.Equal(t, eventID, line.MessageID)
	require.Equal(t, "acme", line.Headers["tenant"])
	require.JSONEq(t, `{"total": 9.5, "items": ["a"]}`, string(line.Body))
}

// The text form prints one line per message, its headers sorted, and a
// body that is neither JSON nor text as base64; tail exits 0 on SIGTERM and
// takes copies only, so a queue of the exchange's own still gets the
// message.
func TestTailPrintsTextAndStopsOnSIGTERM(t *testing.T) {
	t.Parallel()
	exchange := testkit.NewExchange(t)
	q := testkit.NewQueue(t, exchange, "#")
	tail := startTail(t, tailEnv(exchange))

	publishRaw(t, exchange, "invoice.paid", amqp.Publishing{MessageId: "m-1", Type: "paid", ContentType: "application/octet-stream",
		Headers: amqp.Table{"b": "2", "a": "1"}, Body: []byte{0xff, 0x00, 0x01}})
	tail.AwaitOutput(30*time.Second, "the message printed", func(out string) bool { return strings.Contains(out, "base64:") })
	q.Receive(t, 1, 10*time.Second)
	tail.Stop(10 * time.Second)

	out := tail.Out.String()
	require.Contains(t, out, exchange+" invoice.paid message_id=m-1 type=paid content_type=application/octet-stream\n  a: 1\n  b: 2\n  base64:/wAB\n")
}

// A missing exchange is a usage error naming the flag; tail creates
// nothing.
func TestTailRefusesAMissingExchange(t *testing.T) {
	t.Parallel()
	missing := testkit.UniqueName("outboxrelay_test_missing")
	code, stdout, stderr := runOnce(t, tailEnv(missing), "tail")
	require.Equal(t, 2, code, stderr)
	require.Empty(t, stdout)
	require.Contains(t, stderr, `--exchange "`+missing+`": no such exchange`)
}

// A broker that cannot be reached, or a URL that does not parse (whose
// error, as amqp091-go writes it, quotes the URL), is a usage error naming
// the flag, and the URL's password is never printed.
func TestTailBadBrokerURLNeverPrintsThePassword(t *testing.T) {
	t.Parallel()
	for _, url := range []string{
		"amqp://guest:tail-s3cret@127.0.0.1:1/",
		"amqp://guest:tail-s3cret@127.0.0.1:badport/",
	} {
		env := []string{"PATH=" + os.Getenv("PATH"), "AMQP_URL=" + url}
		code, stdout, stderr := runOnce(t, env, "tail")
		require.Equal(t, 2, code, stderr)
		require.Contains(t, stderr, "--amqp-url / AMQP_URL")
		require.NotContains(t, stdout+stderr, "tail-s3cret")
	}
}
