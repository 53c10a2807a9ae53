package main_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/outbox"
)

// A Protocol Buffers message written as PayloadBytes arrives byte for byte
// with its content type, and decodes to the message written; bytes without
// a content type go as application/octet-stream; a JSON event is published
// as before, as application/json.
func TestBinaryPayloadsArriveByteForByte(t *testing.T) {
	t.Parallel()
	dbURL, pool := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "#")
	p := startedRelay(t, relayEnv(dbURL, exchange))

	msg, err := structpb.NewStruct(map[string]any{"order": 42.0, "lines": []any{"a", "b"}, "paid": true})
	require.NoError(t, err)
	body, err := proto.Marshal(msg)
	require.NoError(t, err)
	raw := []byte{0, 1, 2, 0xfe, 0xff}
	ids, err := outbox.Writer{}.Write(t.Context(), pool,
		outbox.Event{AggregateType: "order", AggregateID: "42", EventType: "created", PayloadBytes: body, ContentType: "application/x-protobuf"},
		outbox.Event{AggregateType: "order", AggregateID: "42", EventType: "blob", PayloadBytes: raw},
		outbox.Event{AggregateType: "order", AggregateID: "42", EventType: "paid", Payload: map[string]int{"order": 42}},
	)
	require.NoError(t, err)

	got := map[string]struct {
		body        []byte
		contentType string
	}{}
	for len(got) < len(ids) {
		select {
		case d := <-queue.Deliveries:
			got[d.MessageId] = struct {
				body        []byte
				contentType string
			}{d.Body, d.ContentType}
		case <-p.Done():
			t.Fatalf("the relay exited: %v", p.Err())
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of %d events arrived", len(got), len(ids))
		}
	}
	require.Equal(t, body, got[ids[0]].body)
	require.Equal(t, "application/x-protobuf", got[ids[0]].contentType)
	var back structpb.Struct
	require.NoError(t, proto.Unmarshal(got[ids[0]].body, &back))
	require.True(t, proto.Equal(msg, &back), "the message read back differs from the one written")
	require.Equal(t, raw, got[ids[1]].body)
	require.Equal(t, "application/octet-stream", got[ids[1]].contentType)
	require.JSONEq(t, `{"order": 42}`, string(got[ids[2]].body))
	require.Equal(t, "application/json", got[ids[2]].contentType)
	p.Stop(60 * time.Second)
}
