package publish

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/redact"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// With a list of URLs, Dial tries them in turn: a first broker that refuses
// the connection is skipped, the second answers, and the publisher says
// which one it is connected to, in Broker and in its log.
func TestDialTriesTheURLsInTurn(t *testing.T) {
	t.Parallel()
	down := "amqp://guest:guest@" + closedAddr(t) + "/"
	logs := &testkit.Buffer{}
	exchange := testkit.NewExchange(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := Dial(ctx, Config{
		URL:      down + ", " + testkit.AMQPURL(),
		Exchange: exchange,
		Logger:   slog.New(slog.NewJSONHandler(logs, nil)),
	})
	require.NoError(t, err)
	run(t, p)
	want := redact.URL(testkit.AMQPURL())
	require.Equal(t, want, p.Broker())
	require.Contains(t, logs.String(), `"msg":"connected","component":"publish","url":"`+want+`"`)
	q := testkit.NewQueue(t, exchange, "#")
	msgs := batch(5, "k")
	requireAllNil(t, publish(t, p, msgs))
	receive(t, q, msgs)
}

// When no broker of the list answers, the error names each one's failure,
// every password redacted, and Dial does not retry.
func TestDialWithNoBrokerAnsweringNamesEach(t *testing.T) {
	t.Parallel()
	first, second := closedAddr(t), closedAddr(t)
	list := "amqp://relay:s3cr3t-one@" + first + "/,amqp://relay:s3cr3t-two@" + second + "/"
	p, err := Dial(context.Background(), Config{URL: list, Exchange: "unused", SkipDeclare: true})
	require.Error(t, err)
	require.Nil(t, p)
	msg := err.Error()
	require.NotContains(t, msg, "s3cr3t")
	require.Contains(t, msg, "none of 2 brokers answered")
	require.Contains(t, msg, "connect amqp://relay:xxxxx@"+first+"/: ")
	require.Contains(t, msg, "connect amqp://relay:xxxxx@"+second+"/: ")
	var opErr *net.OpError
	require.ErrorAs(t, err, &opErr, "the dial errors stay reachable")
}

// Every URL of a list is checked, and a bad one is named by its place in
// the list, password redacted.
func TestConfigValidatesEveryURLOfTheList(t *testing.T) {
	t.Parallel()
	err := Config{URL: testkit.AMQPURL() + ",http://relay:s3cr3t@host/"}.Validate()
	require.ErrorContains(t, err, "URL 2 of 2 http://relay:xxxxx@host/: scheme must be amqp or amqps")
	require.NotContains(t, err.Error(), "s3cr3t")
	require.ErrorContains(t, Config{URL: " , "}.Validate(), "no URL in the list")
}

// A reconnect starts after the broker it lost: with two brokers in the
// list, cutting the connection to the first moves the publisher to the
// second even though the first accepts connections again at once (a node
// that drops its clients is often not done failing), and it publishes
// there; Broker says so.
func TestReconnectMovesToTheNextBroker(t *testing.T) {
	t.Parallel()
	proxyA, urlA := testkit.NewAMQPProxy(t)
	_, urlB := testkit.NewAMQPProxy(t)
	exchange := testkit.NewExchange(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := Dial(ctx, Config{
		URL: urlA + "," + urlB, Exchange: exchange,
		ReconnectMin: 20 * time.Millisecond, ReconnectMax: 200 * time.Millisecond,
	})
	require.NoError(t, err)
	require.Equal(t, redact.URL(urlA), p.Broker(), "the first that answers is the first of the list")
	q := warm(t, p)

	// Cut the connection and accept new ones at once: the first broker
	// answers again, yet the reconnect starts with the second.
	proxyA.Cut()
	proxyA.Restore()
	testkit.WaitFor(t, 15*time.Second, "the publisher to reconnect to the second broker", func() bool {
		connected, _ := p.State()
		return connected && p.Broker() == redact.URL(urlB)
	})
	msgs := batch(20, "k")
	requireAllNil(t, publish(t, p, msgs))
	receive(t, q, msgs)
}
