package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testkit.LeakOptions()...)
}

// start dials a publisher with cfg (URL and Exchange default to the test
// broker and a fresh exchange), runs it, and stops it when the test ends,
// checking that Run returned nil.
func start(t *testing.T, cfg Config) *Publisher {
	t.Helper()
	return run(t, dial(t, cfg))
}

// dial dials a publisher with cfg; URL and Exchange default to the test
// broker and a fresh exchange.
func dial(t *testing.T, cfg Config) *Publisher {
	t.Helper()
	if cfg.URL == "" {
		cfg.URL = testkit.AMQPURL()
	}
	if cfg.Exchange == "" {
		cfg.Exchange = testkit.NewExchange(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := Dial(ctx, cfg)
	require.NoError(t, err)
	return p
}

func run(t *testing.T, p *Publisher) *Publisher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(15 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
	return p
}

// batch makes n messages routed by key, each with a unique id.
func batch(n int, key string) []Message {
	prefix := testkit.UniqueName("msg")
	msgs := make([]Message, n)
	for i := range msgs {
		msgs[i] = Message{
			RoutingKey: key,
			MessageID:  fmt.Sprintf("%s-%d", prefix, i),
			Type:       "order.created",
			Timestamp:  time.Now(),
			Body:       fmt.Appendf(nil, `{"n":%d}`, i),
		}
	}
	return msgs
}

func publish(t *testing.T, p *Publisher, msgs []Message) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := p.Publish(ctx, msgs)
	require.Len(t, errs, len(msgs))
	return errs
}

func requireAllNil(t *testing.T, errs []error) {
	t.Helper()
	for i, err := range errs {
		require.NoError(t, err, "message %d", i)
	}
}

// receive waits until the queue has delivered every message of ids,
// ignoring others (leftovers of an interrupted batch).
func receive(t *testing.T, q *testkit.Queue, msgs []Message) map[string]amqp.Delivery {
	t.Helper()
	want := make(map[string]bool, len(msgs))
	for _, m := range msgs {
		want[m.MessageID] = true
	}
	got := make(map[string]amqp.Delivery, len(msgs))
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for len(got) < len(want) {
		select {
		case d, ok := <-q.Deliveries:
			require.True(t, ok, "queue %s closed", q.Name)
			if want[d.MessageId] {
				got[d.MessageId] = d
			}
		case <-deadline.C:
			t.Fatalf("queue %s: %d of %d messages", q.Name, len(got), len(want))
		}
	}
	return got
}

func TestPublishBatch(t *testing.T) {
	t.Parallel()
	p := start(t, Config{})
	q := testkit.NewQueue(t, p.cfg.Exchange, "order.#")

	msgs := batch(1000, "order.created")
	ts := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	for i := range msgs {
		msgs[i].Timestamp = ts
		msgs[i].Headers = amqp.Table{
			"aggregate_id": fmt.Sprint(i),
			"n":            int64(i),
			"ratio":        0.5,
			"ok":           true,
			"nested":       amqp.Table{"a": "b"},
			"list":         []any{"x", int64(1)},
			"none":         nil,
		}
	}
	start := time.Now()
	requireAllNil(t, publish(t, p, msgs))
	t.Logf("1000 messages confirmed in %s", time.Since(start))

	got := receive(t, q, msgs)
	for i, m := range msgs {
		d := got[m.MessageID]
		require.Equal(t, m.MessageID, d.MessageId)
		require.Equal(t, "order.created", d.Type)
		require.Equal(t, "order.created", d.RoutingKey)
		require.Equal(t, p.cfg.Exchange, d.Exchange)
		require.Equal(t, "application/json", d.ContentType)
		require.Equal(t, amqp.Persistent, d.DeliveryMode)
		require.Equal(t, ts.Unix(), d.Timestamp.Unix())
		require.Equal(t, m.Body, d.Body)
		require.Equal(t, amqp.Table{
			"aggregate_id": fmt.Sprint(i),
			"n":            int64(i),
			"ratio":        0.5,
			"ok":           true,
			"nested":       amqp.Table{"a": "b"},
			"list":         []any{"x", int64(1)},
			"none":         nil,
		}, d.Headers)
	}
}

func TestPublishEmpty(t *testing.T) {
	t.Parallel()
	p := start(t, Config{})
	require.Empty(t, p.Publish(context.Background(), nil))
}

func TestPublishReturned(t *testing.T) {
	t.Parallel()
	p := start(t, Config{})
	q := testkit.NewQueue(t, p.cfg.Exchange, "bound.#")

	msgs := batch(5, "bound.a")
	msgs[1].RoutingKey = "nowhere"
	msgs[3].RoutingKey = "nowhere.else"
	errs := publish(t, p, msgs)
	for i, err := range errs {
		if i == 1 || i == 3 {
			require.ErrorIs(t, err, ErrReturned, "message %d", i)
			require.ErrorContains(t, err, "312 NO_ROUTE")
			continue
		}
		require.NoError(t, err, "message %d", i)
	}
	receive(t, q, []Message{msgs[0], msgs[2], msgs[4]})

	// The channel went back to the pool clean: the next batch on it has
	// nothing returned.
	next := batch(3, "bound.b")
	requireAllNil(t, publish(t, p, next))
	receive(t, q, next)
}

func TestPublishExchangeNotFound(t *testing.T) {
	t.Parallel()
	p := start(t, Config{})
	q := testkit.NewQueue(t, p.cfg.Exchange, "#")
	other := testkit.NewExchange(t)
	otherQ := testkit.NewQueue(t, other, "#")
	missing := testkit.UniqueName("outboxrelay_missing")

	for range 2 { // the second time, other is cached and missing is not
		msgs := batch(4, "k")
		msgs[1].Exchange = missing
		msgs[2].Exchange = other
		errs := publish(t, p, msgs)
		require.NoError(t, errs[0])
		require.ErrorIs(t, errs[1], ErrExchangeNotFound)
		require.ErrorContains(t, errs[1], missing)
		require.NoError(t, errs[2])
		require.NoError(t, errs[3])
		receive(t, q, []Message{msgs[0], msgs[3]})
		receive(t, otherQ, msgs[2:3])
	}
}

func TestPublishExchangeDeletedAfterCheck(t *testing.T) {
	t.Parallel()
	p := start(t, Config{})
	testkit.NewQueue(t, p.cfg.Exchange, "#")
	other := testkit.NewExchange(t)
	otherQ := testkit.NewQueue(t, other, "#")

	msgs := batch(2, "k")
	msgs[1].Exchange = other
	requireAllNil(t, publish(t, p, msgs))
	receive(t, otherQ, msgs[1:])

	// other is cached as known; deleting it makes the next publish to it
	// close the channel (404), failing the batch. The publisher forgets it,
	// so the batch after that fails it alone, with ErrExchangeNotFound.
	testkit.DeleteExchange(t, other)
	msgs = batch(2, "k")
	msgs[1].Exchange = other
	errs := publish(t, p, msgs)
	require.Error(t, errs[1])
	require.ErrorContains(t, errs[1], "404")

	msgs = batch(2, "k")
	msgs[1].Exchange = other
	errs = publish(t, p, msgs)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], ErrExchangeNotFound)
}

func TestPublishDefaultExchangeRedeclared(t *testing.T) {
	t.Parallel()
	name := testkit.UniqueName("outboxrelay_test")
	p := start(t, Config{Exchange: name})
	t.Cleanup(func() { testkit.DeleteExchange(t, name) })

	// Deleted under the publisher: the first batch fails (404), the next
	// declares it again (unbound, so the message comes back).
	testkit.DeleteExchange(t, name)
	errs := publish(t, p, batch(1, "k"))
	require.ErrorContains(t, errs[0], "404")
	t.Logf("after the delete: %v", errs[0])
	errs = publish(t, p, batch(1, "k"))
	require.ErrorIs(t, errs[0], ErrReturned)

	q := testkit.NewQueue(t, name, "#")
	msgs := batch(2, "k")
	requireAllNil(t, publish(t, p, msgs))
	receive(t, q, msgs)
}

func TestPublishInvalid(t *testing.T) {
	t.Parallel()
	p := start(t, Config{MaxMessageSize: 1024})
	q := testkit.NewQueue(t, p.cfg.Exchange, "#")

	msgs := batch(8, "k")
	msgs[1].Body = make([]byte, 1025)
	msgs[2].RoutingKey = strings.Repeat("r", 256)
	msgs[3].Headers = amqp.Table{"bad": uint64(1)}
	msgs[4].Headers = amqp.Table{"nested": amqp.Table{strings.Repeat("k", 256): "v"}}
	msgs[5].Exchange = strings.Repeat("e", 256)
	msgs[6].MessageID = strings.Repeat("i", 256)
	msgs[7].Body = make([]byte, 1024) // exactly the limit: fine
	msgs[7].RoutingKey = strings.Repeat("r", 255)

	errs := publish(t, p, msgs)
	require.NoError(t, errs[0])
	for i := 1; i <= 6; i++ {
		require.ErrorIs(t, errs[i], ErrInvalid, "message %d", i)
	}
	require.NoError(t, errs[7])
	// Each layer names itself once.
	require.EqualError(t, errs[1], "publish: invalid message: body is 1025 bytes, more than MaxMessageSize 1024")
	require.EqualError(t, errs[3], `publish: invalid message: headers: key "bad": uint64 not supported`)
	require.EqualError(t, errs[4], `publish: invalid message: headers: key "nested": key "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk"… is 256 bytes, more than 255`)
	receive(t, q, []Message{msgs[0], msgs[7]})

	// Nothing invalid reached the wire: the connection is intact.
	next := batch(2, "k")
	requireAllNil(t, publish(t, p, next))
	receive(t, q, next)
}

func TestPublishNacked(t *testing.T) {
	t.Parallel()
	p := start(t, Config{})

	// A queue that holds one message and refuses more with a nack.
	conn, err := amqp.Dial(testkit.AMQPURL())
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	queue, err := ch.QueueDeclare(testkit.UniqueName("outboxrelay_test"), false, true, true, false,
		amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"})
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(queue.Name, "full", p.cfg.Exchange, false, nil))

	msgs := batch(3, "full")
	errs := publish(t, p, msgs)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], ErrNacked)
	require.ErrorIs(t, errs[2], ErrNacked)

	// A nack does not spoil the channel.
	q := testkit.NewQueue(t, p.cfg.Exchange, "open")
	next := batch(2, "open")
	requireAllNil(t, publish(t, p, next))
	receive(t, q, next)
}

func TestPublishCanceled(t *testing.T) {
	t.Parallel()
	p := start(t, Config{})
	q := testkit.NewQueue(t, p.cfg.Exchange, "#")
	requireAllNil(t, publish(t, p, batch(1, "k"))) // a channel in the pool

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, err := range p.Publish(ctx, batch(3, "k")) {
		require.ErrorIs(t, err, context.Canceled)
	}
	// Nothing was sent: the channel went back to the pool.
	p.mu.Lock()
	idle := len(p.idle)
	p.mu.Unlock()
	require.Equal(t, 1, idle)

	msgs := batch(3, "k")
	requireAllNil(t, publish(t, p, msgs))
	receive(t, q, msgs)
}

func TestPublishConcurrent(t *testing.T) {
	t.Parallel()
	p := start(t, Config{})
	q := testkit.NewQueue(t, p.cfg.Exchange, "#")

	const workers, batches, size = 8, 10, 50
	all := make([][]Message, workers*batches)
	for i := range all {
		all[i] = batch(size, "order.created")
	}
	results := make([][]error, len(all))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for b := range batches {
				i := w*batches + b
				results[i] = p.Publish(context.Background(), all[i])
			}
		})
	}
	wg.Wait()
	var msgs []Message
	for i := range all {
		requireAllNil(t, results[i])
		msgs = append(msgs, all[i]...)
	}
	require.Len(t, receive(t, q, msgs), workers*batches*size)

	p.mu.Lock()
	idle := len(p.idle)
	p.mu.Unlock()
	require.LessOrEqual(t, idle, workers, "one channel per concurrent batch at most")
}

func TestDialFailsFast(t *testing.T) {
	t.Parallel()
	addr := closedAddr(t)

	for _, tc := range []struct {
		name string
		url  string
		max  time.Duration
	}{
		{"unreachable", "amqp://relay:s3cr3t-pw@" + addr + "/", 2 * time.Second},
		// RabbitMQ itself answers a failed login after about 3s.
		{"wrong password", "amqp://guest:s3cr3t-pw@127.0.0.1:5672/", 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			begin := time.Now()
			p, err := Dial(context.Background(), Config{URL: tc.url, Exchange: "unused", SkipDeclare: true})
			require.Error(t, err)
			require.Nil(t, p)
			require.Less(t, time.Since(begin), tc.max, "no retries")
			require.NotContains(t, err.Error(), "s3cr3t-pw")
			require.Contains(t, err.Error(), "xxxxx", "names the redacted URL: %v", err)
			t.Log(err)
		})
	}
}

func TestDialCanceled(t *testing.T) {
	t.Parallel()
	// A listener that accepts and never answers: the AMQP handshake hangs
	// until ctx ends.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var conns []net.Conn
	var mu sync.Mutex
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-accepted
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	begin := time.Now()
	_, err = Dial(ctx, Config{URL: "amqp://" + l.Addr().String() + "/", DialTimeout: 30 * time.Second})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(begin), 5*time.Second)
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, Config{}.Validate())
	for _, tc := range []struct {
		cfg     Config
		setting string
		want    string
	}{
		{Config{ConfirmTimeout: -1}, "ConfirmTimeout", "publish: ConfirmTimeout -1ns: must be positive"},
		{Config{MaxMessageSize: -1}, "MaxMessageSize", "publish: MaxMessageSize"},
		{Config{Heartbeat: time.Millisecond}, "Heartbeat", "publish: Heartbeat"},
		{Config{DialTimeout: -time.Second}, "DialTimeout", "publish: DialTimeout"},
		{Config{ReconnectMin: -time.Second}, "ReconnectMin", "publish: ReconnectMin"},
		{Config{ReconnectMin: time.Second, ReconnectMax: time.Millisecond}, "ReconnectMax", "publish: ReconnectMax"},
		{Config{Exchange: strings.Repeat("x", 256)}, "Exchange", "publish: Exchange"},
		{Config{URL: "http://guest:pw-secret@host/"}, "URL", "publish: URL http://guest:xxxxx@host/: scheme"},
		{Config{URL: "amqp://guest:pw-se%cret@host/"}, "URL", "publish: URL"},
		{Config{URL: "amqp://host/,amqp://guest:pw-secret@host:x/"}, "URL", "publish: URL 2 of 2"},
		{Config{URL: " , "}, "URL", "publish: URL: no URL in the list"},
	} {
		err := tc.cfg.Validate()
		require.ErrorContains(t, err, tc.want)
		require.NotContains(t, err.Error(), "pw-se")
		var cerr *ConfigError
		require.ErrorAs(t, err, &cerr)
		require.Equal(t, tc.setting, cerr.Setting, "%v", err)
	}
}

func TestClose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, err := Dial(ctx, Config{URL: testkit.AMQPURL(), Exchange: testkit.NewExchange(t)})
	require.NoError(t, err)
	require.NoError(t, p.Close())
	require.NoError(t, p.Close())
	require.ErrorIs(t, p.Publish(ctx, batch(1, "k"))[0], ErrClosed)
	require.ErrorIs(t, p.WaitReady(ctx), ErrClosed)
	require.ErrorIs(t, p.Run(ctx), ErrClosed)

	// Close while Run runs stops Run.
	p, err = Dial(ctx, Config{URL: testkit.AMQPURL(), Exchange: testkit.NewExchange(t)})
	require.NoError(t, err)
	testkit.NewQueue(t, p.cfg.Exchange, "#")
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	waitReady(t, p)
	requireAllNil(t, publish(t, p, batch(3, "k")))
	require.NoError(t, p.Close())
	require.NoError(t, <-done)
	require.ErrorIs(t, p.Publish(ctx, batch(1, "k"))[0], ErrClosed)
}

// Every failure the package produces wraps exactly one of the error kinds,
// its own, and is labelled as its kind: two kinds that were one, a failure
// wrapping the wrong kind or two kinds, or a kind misclassified as another
// (transient for permanent, say) fails here.
func TestErrorKinds(t *testing.T) {
	t.Parallel()
	kinds := []error{ErrInvalid, ErrReturned, ErrNacked, ErrExchangeNotFound, ErrNotConnected, ErrClosed}
	texts := make(map[string]bool)
	for _, k := range kinds {
		require.True(t, strings.HasPrefix(k.Error(), "publish: "), k.Error())
		require.False(t, texts[k.Error()], "two kinds read %q", k.Error())
		texts[k.Error()] = true
	}

	returned := make([]error, 1)
	(&Publisher{log: slog.New(slog.DiscardHandler)}).matchReturns(
		[]amqp.Return{{MessageId: "id", Exchange: "e", RoutingKey: "k", ReplyCode: amqp.NoRoute, ReplyText: "NO_ROUTE"}},
		[]pending{{i: 0}}, []string{"e"}, []Message{{MessageID: "id", RoutingKey: "k"}}, returned)
	big := (&Message{Headers: bigHeaders()}).publishing()
	current := func(p *Publisher) error {
		_, _, _, err := p.current()
		return err
	}
	for _, tc := range []struct {
		name  string
		err   error
		kind  error // nil: transient, none of the kinds
		label string
	}{
		{"body too large", (&Message{Body: []byte("{}")}).validate("e", 1), ErrInvalid, "invalid"},
		{"header value", (&Message{Headers: amqp.Table{"u": uint64(1)}}).validate("e", 1), ErrInvalid, "invalid"},
		{"headers over a frame", checkHeaderFrame(&big, 131072), ErrInvalid, "invalid"},
		{"headers not an object", func() error { _, err := HeadersFromJSON([]byte("[]")); return err }(), ErrInvalid, "invalid"},
		{"returned", returned[0], ErrReturned, "returned"},
		{"nacked", ErrNacked, ErrNacked, "nacked"},
		{"exchange missing", checkError("x", &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND"}), ErrExchangeNotFound, ReasonMissingExchange},
		{"exchange check refused", checkError("x", &amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED"}), nil, ReasonConnection},
		{"disconnected", current(&Publisher{}), ErrNotConnected, "connection"},
		{"blocked", current(&Publisher{conn: new(amqp.Connection), isBlock: true, blocked: "low on memory"}), ErrNotConnected, "connection"},
		{"closed", current(&Publisher{closed: true}), ErrClosed, "connection"},
	} {
		require.Error(t, tc.err, tc.name)
		for _, k := range kinds {
			require.Equal(t, k == tc.kind, errors.Is(tc.err, k), "%s: %v is %v", tc.name, tc.err, k)
		}
		require.Equal(t, tc.label, Reason(tc.err), "%s: %v", tc.name, tc.err)
		require.Equal(t, 1, strings.Count(tc.err.Error(), "publish:"), "%s: %v", tc.name, tc.err)
	}
}
