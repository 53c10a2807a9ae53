package outbox_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/outbox"
)

// PayloadBytes are stored as they are, with their content type and JSON
// null in payload; a JSON event of the same call is written as before.
func TestPayloadBytesAreStoredAsTheyAre(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	url, pool := newOutbox(t)
	body := []byte{0x08, 0x96, 0x01, 0x00, 0xff, '\\', '"', 0x7b}
	events := []outbox.Event{
		{AggregateType: "order", AggregateID: "1", EventType: "created", PayloadBytes: body, ContentType: "application/x-protobuf"},
		{AggregateType: "order", AggregateID: "1", EventType: "paid", PayloadBytes: []byte{}},
		{AggregateType: "order", AggregateID: "1", EventType: "shipped", Payload: map[string]int{"n": 1}},
	}
	_, err := outbox.Writer{}.Write(ctx, pool, events...)
	must(t, err, "Write")
	_, err = outbox.Writer{}.WriteSQL(ctx, openSQL(t, url), events[0])
	must(t, err, "WriteSQL")
	type stored struct {
		payload     string
		bytes       []byte
		contentType *string
	}
	rows, err := pool.Query(ctx, `SELECT payload::text, payload_bytes, content_type FROM outbox ORDER BY id`)
	must(t, err, "select")
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (s stored, err error) {
		return s, r.Scan(&s.payload, &s.bytes, &s.contentType)
	})
	must(t, err, "read")
	equal(t, "rows", len(got), 4)
	for _, i := range []int{0, 3} {
		equal(t, "bytes", bytes.Equal(got[i].bytes, body), true)
		equal(t, "payload of a binary event", got[i].payload, "null")
		equal(t, "content type", *got[i].contentType, "application/x-protobuf")
	}
	equal(t, "empty bytes are bytes, not NULL", got[1].bytes != nil && len(got[1].bytes) == 0, true)
	equal(t, "no content type", got[1].contentType == nil, true)
	equal(t, "JSON payload", got[2].payload, `{"n": 1}`)
	equal(t, "JSON event without bytes", got[2].bytes == nil, true)
}

// A table made ready by an earlier drop-in SQL has no binary columns: JSON
// events are written to it as before, and a binary one fails naming the
// missing column.
func TestJSONEventsNeedNoBinaryColumns(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	_, pool := newOutbox(t)
	execSQL(t, pool, `ALTER TABLE outbox DROP COLUMN payload_bytes, DROP COLUMN content_type`)
	_, err := outbox.Writer{}.Write(ctx, pool, outbox.Event{AggregateType: "a", AggregateID: "1", EventType: "b", Payload: 1})
	must(t, err, "JSON Write")
	_, err = outbox.Writer{}.Write(ctx, pool, outbox.Event{AggregateType: "a", AggregateID: "1", EventType: "b", PayloadBytes: []byte{1}})
	if err == nil || !strings.Contains(err.Error(), "payload_bytes") {
		t.Fatalf("binary Write: %v, want an error naming payload_bytes", err)
	}
}

func TestBinaryEventValidation(t *testing.T) {
	t.Parallel()
	for name, e := range map[string]outbox.Event{
		"PayloadBytes with Payload": {AggregateType: "a", AggregateID: "1", EventType: "b", Payload: 1, PayloadBytes: []byte{1}},
		"ContentType":               {AggregateType: "a", AggregateID: "1", EventType: "b", ContentType: strings.Repeat("x", 256)},
		"ContentType NUL":           {AggregateType: "a", AggregateID: "1", EventType: "b", ContentType: "a\x00b"},
	} {
		if err := e.Validate(); !errors.Is(err, outbox.ErrInvalidEvent) {
			t.Errorf("%s: %v, want ErrInvalidEvent", name, err)
		}
	}
}
