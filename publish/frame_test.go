package publish

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// bigHeaders is the poison row of issue 13: 2,000 keys of 100 bytes each,
// 221 kB encoded, well over RabbitMQ's default frame_max of 128 KiB.
func bigHeaders() amqp.Table {
	t := make(amqp.Table, 2000)
	for i := range 2000 {
		t[fmt.Sprintf("%0100d", i)] = "v"
	}
	return t
}

// frameTooLarge matches RabbitMQ's refusal of a frame: the payload's size,
// then the largest it accepts (frame_max - 8).
var frameTooLarge = regexp.MustCompile(`frame_too_large,(\d+),(\d+)`)

// sendRaw sends pub as it is, with amqp091 alone, on a connection of its
// own. It returns the connection's frame size and, if RabbitMQ refused the
// frame and closed the connection, the payload size it reported; 0 if it
// confirmed the message instead.
func sendRaw(t *testing.T, pub amqp.Publishing) (frameSize, refused int) {
	t.Helper()
	conn, err := amqp.Dial(testkit.AMQPURL())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	// The default exchange: the frame is refused before any routing.
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", "nowhere", false, false, pub)
	refusal := func(cerr *amqp.Error) int {
		t.Helper()
		require.NotNil(t, cerr)
		m := frameTooLarge.FindStringSubmatch(cerr.Reason)
		require.NotNil(t, m, "not a frame_too_large: %v", cerr)
		payload, _ := strconv.Atoi(m[1])
		max, _ := strconv.Atoi(m[2])
		require.Equal(t, conn.Config.FrameSize-frameOverhead, max)
		return payload
	}
	if err != nil {
		// RabbitMQ refused the header frame and closed the connection
		// before amqp091 had sent the body frame after it (found by CI):
		// the close's reason follows.
		require.ErrorIs(t, err, amqp.ErrClosed)
		select {
		case cerr := <-closed:
			return conn.Config.FrameSize, refusal(cerr)
		case <-time.After(10 * time.Second):
			t.Fatal("the publish failed, and the connection was not closed")
		}
	}
	select {
	case cerr := <-closed:
		return conn.Config.FrameSize, refusal(cerr)
	case <-dc.Done():
		if dc.Acked() {
			return conn.Config.FrameSize, 0
		}
		// The connection's close ended the confirmation first (found by
		// CI: the two are ready together, and select may take either):
		// its reason follows.
		select {
		case cerr := <-closed:
			return conn.Config.FrameSize, refusal(cerr)
		case <-time.After(10 * time.Second):
			t.Fatal("the message was not confirmed, and the connection was not closed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("RabbitMQ neither confirmed the message nor closed the connection")
	}
	return 0, 0
}

// headerFrameSize counts every byte of the frame as RabbitMQ does: a
// header frame too large for the connection makes RabbitMQ report the
// size of its payload, which must be what headerFrameSize says, for every
// type of field and every property.
func TestHeaderFrameSizeIsWhatRabbitMQCounts(t *testing.T) {
	t.Parallel()
	every := amqp.Table{
		"nil": nil, "bool": true, "byte": byte(1), "int8": int8(-1), "int16": int16(-2),
		"uint16": uint16(2), "int": 3, "int32": int32(-3), "uint32": uint32(3),
		"float32": float32(1.5), "int64": int64(-4), "float64": 2.5,
		"time": time.Unix(1700000000, 0), "decimal": amqp.Decimal{Scale: 2, Value: 12345},
		"string": "héllo", "bytes": []byte{0, 1, 2},
		"array": []any{nil, true, int64(1), "x", []any{"y"}, amqp.Table{"k": 1.5}},
		"table": amqp.Table{"a": amqp.Table{"b": []any{}}, "": ""},
		"empty": amqp.Table{},
	}
	for _, tc := range []struct {
		name string
		pub  amqp.Publishing
	}{
		{"as the publisher sends it", (&Message{
			RoutingKey: "k", MessageID: "id-1", Type: "order.created", Timestamp: time.Now(), Headers: bigHeaders(),
		}).publishing()},
		{"every field type", (&Message{MessageID: "id-2", Headers: func() amqp.Table {
			h := bigHeaders()
			for k, v := range every {
				h[k] = v
			}
			return h
		}()}).publishing()},
		{"every property", amqp.Publishing{
			ContentType: "text/plain", ContentEncoding: "gzip", DeliveryMode: amqp.Transient, Priority: 3,
			CorrelationId: "corr", ReplyTo: "reply", Expiration: "60000", MessageId: "id-3",
			Timestamp: time.Now(), Type: "t", UserId: "guest", AppId: "app",
			Headers: amqp.Table{"pad": strings.Repeat("p", 200_000)}, Body: []byte("{}"),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			frameSize, payload := sendRaw(t, tc.pub)
			require.Equal(t, headerFrameSize(&tc.pub)-frameOverhead, payload)
			require.ErrorIs(t, checkHeaderFrame(&tc.pub, frameSize), ErrInvalid)
		})
	}
}

// padTo returns a message whose content header frame, as the publisher
// sends it, is exactly size bytes.
func padTo(t *testing.T, m Message, size int) Message {
	t.Helper()
	m.Headers = amqp.Table{"pad": ""}
	pub := m.publishing()
	m.Headers = amqp.Table{"pad": strings.Repeat("p", size-headerFrameSize(&pub))}
	pub = m.publishing()
	require.Equal(t, size, headerFrameSize(&pub))
	return m
}

// RabbitMQ tolerates a frame 8 bytes over frame_max (a payload of up to
// frame_max bytes, not frame_max - 8: its FRAME_SIZE_FUDGE); the
// publisher keeps to the specification's limit, 8 bytes short of what
// RabbitMQ would take.
func TestRabbitMQFrameLimit(t *testing.T) {
	t.Parallel()
	conn, err := amqp.Dial(testkit.AMQPURL())
	require.NoError(t, err)
	frameSize := conn.Config.FrameSize
	require.NoError(t, conn.Close())

	m := padTo(t, Message{MessageID: "id", Type: "t", Timestamp: time.Now()}, frameSize+8)
	pub := m.publishing()
	_, refused := sendRaw(t, pub)
	require.Zero(t, refused, "frame_max + 8 is accepted")
	require.ErrorIs(t, checkHeaderFrame(&pub, frameSize), ErrInvalid, "the publisher refuses it")

	m = padTo(t, m, frameSize+9)
	pub = m.publishing()
	_, refused = sendRaw(t, pub)
	require.Equal(t, frameSize+1, refused, "frame_max + 9 is refused")
}

// Headers that just fit in a frame of the negotiated size are published;
// a byte more and they are refused before anything is sent (RabbitMQ
// would take up to 8 more: TestRabbitMQFrameLimit), the connection
// untouched.
func TestHeadersAtTheFrameLimit(t *testing.T) {
	t.Parallel()
	p := start(t, Config{})
	q := testkit.NewQueue(t, p.cfg.Exchange, "#")
	p.mu.Lock()
	conn, gen := p.conn, p.gen
	p.mu.Unlock()
	frameSize := conn.Config.FrameSize
	require.Positive(t, frameSize)

	msgs := batch(2, "k")
	msgs[0] = padTo(t, msgs[0], frameSize)
	msgs[1] = padTo(t, msgs[1], frameSize+1)
	errs := publish(t, p, msgs)
	require.NoError(t, errs[0], "a frame of exactly frame_max")
	require.ErrorIs(t, errs[1], ErrInvalid)
	require.ErrorContains(t, errs[1], fmt.Sprintf("content header frame of %d bytes, more than the connection's frame size of %d", frameSize+1, frameSize))
	got := receive(t, q, msgs[:1])
	require.Equal(t, msgs[0].Headers, got[msgs[0].MessageID].Headers)

	p.mu.Lock()
	defer p.mu.Unlock()
	require.Same(t, conn, p.conn, "still on the same connection")
	require.Equal(t, gen, p.gen, "no reconnect")
}

// A message whose headers do not fit in one frame fails alone, at once and
// for good; before, RabbitMQ closed the connection on it (frame_too_large),
// failing every batch in flight, on every attempt.
func TestPublishHeadersTooLargeForAFrame(t *testing.T) {
	t.Parallel()
	p := start(t, Config{})
	q := testkit.NewQueue(t, p.cfg.Exchange, "#")
	requireAllNil(t, publish(t, p, batch(1, "k"))) // a channel in the pool
	p.mu.Lock()
	conn, gen := p.conn, p.gen
	p.mu.Unlock()

	msgs := batch(7, "k")
	msgs[3].Headers = bigHeaders()
	errs := publish(t, p, msgs)
	require.ErrorIs(t, errs[3], ErrInvalid)
	require.ErrorContains(t, errs[3], "publish: invalid message: headers: 214004 bytes encoded make a content header frame of")
	require.ErrorContains(t, errs[3], fmt.Sprintf("more than the connection's frame size of %d", conn.Config.FrameSize))
	t.Log(errs[3])
	ok := append(msgs[:3:3], msgs[4:]...)
	for i, err := range errs {
		if i != 3 {
			require.NoError(t, err, "message %d", i)
		}
	}
	receive(t, q, ok)

	p.mu.Lock()
	require.Same(t, conn, p.conn, "still on the same connection")
	require.Equal(t, gen, p.gen, "no reconnect")
	require.Len(t, p.idle, 1, "the channel went back to the pool")
	p.mu.Unlock()
	next := batch(3, "k")
	requireAllNil(t, publish(t, p, next))
	receive(t, q, next)
}
