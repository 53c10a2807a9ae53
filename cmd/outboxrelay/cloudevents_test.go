package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/outbox"
)

// deliveryMessage reads an AMQP delivery as a CloudEvents SDK message:
// structured when its content type is application/cloudevents+json, else
// binary, its attributes in ce- headers and its content type in the
// content-type property.
type deliveryMessage struct{ d amqp.Delivery }

var ceHeaders = spec.WithPrefix("ce-")

func (m deliveryMessage) ReadEncoding() binding.Encoding {
	if m.d.ContentType == format.JSON.MediaType() {
		return binding.EncodingStructured
	}
	return binding.EncodingBinary
}

func (m deliveryMessage) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	if m.ReadEncoding() != binding.EncodingStructured {
		return binding.ErrNotStructured
	}
	return w.SetStructuredEvent(ctx, format.JSON, bytes.NewReader(m.d.Body))
}

func (m deliveryMessage) ReadBinary(_ context.Context, w binding.BinaryWriter) error {
	if m.ReadEncoding() != binding.EncodingBinary {
		return binding.ErrNotBinary
	}
	version := m.version()
	if version == nil {
		return binding.ErrNotBinary
	}
	for k, v := range m.d.Headers {
		if attr := version.Attribute(k); attr != nil {
			if err := w.SetAttribute(attr, v); err != nil {
				return err
			}
		} else if name, ok := strings.CutPrefix(k, "ce-"); ok {
			if err := w.SetExtension(name, v); err != nil {
				return err
			}
		}
	}
	if err := w.SetAttribute(version.AttributeFromKind(spec.DataContentType), m.d.ContentType); err != nil {
		return err
	}
	return w.SetData(bytes.NewReader(m.d.Body))
}

func (m deliveryMessage) version() spec.Version {
	v, _ := m.d.Headers["ce-specversion"].(string)
	return ceHeaders.Version(v)
}

func (m deliveryMessage) GetAttribute(k spec.Kind) (spec.Attribute, any) {
	v := m.version()
	if v == nil {
		return nil, nil
	}
	attr := v.AttributeFromKind(k)
	if attr == nil {
		return nil, nil
	}
	if k == spec.DataContentType {
		return attr, m.d.ContentType
	}
	return attr, m.d.Headers[attr.PrefixedName()]
}

func (m deliveryMessage) GetExtension(name string) any { return m.d.Headers["ce-"+name] }

func (deliveryMessage) Finish(error) error { return nil }

// With --message-format cloudevents (binary content mode) and
// cloudevents-structured, the CloudEvents SDK reads each published message
// into the event written: id, source, type, subject, time, content type and
// data, JSON and binary alike; the producer's trace context arrives with
// it.
func TestCloudEventsReadBackBySDK(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"cloudevents", "cloudevents-structured"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			dbURL, pool := testkit.NewOutbox(t)
			exchange := testkit.NewExchange(t)
			queue := testkit.NewQueue(t, exchange, "#")
			p := startedRelay(t, relayEnv(dbURL, exchange), "--message-format="+mode, "--cloudevents-source=https://orders.example.com")

			traceID := trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36}
			ctx := trace.ContextWithSpanContext(t.Context(), trace.NewSpanContext(trace.SpanContextConfig{
				TraceID: traceID, SpanID: trace.SpanID{0, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}, TraceFlags: trace.FlagsSampled}))
			written := []outbox.Event{
				{AggregateType: "order", AggregateID: "42", EventType: "created", Payload: map[string]any{"total": 12.5}},
				{AggregateType: "order", AggregateID: "42", EventType: "packed", PayloadBytes: []byte{8, 0x96, 1, 0xff}, ContentType: "application/x-protobuf"},
			}
			ids, err := outbox.Writer{}.Write(ctx, pool, written...)
			require.NoError(t, err)

			for i := range written {
				var d amqp.Delivery
				select {
				case d = <-queue.Deliveries:
				case <-p.Done():
					t.Fatalf("the relay exited: %v", p.Err())
				case <-time.After(30 * time.Second):
					t.Fatalf("event %d did not arrive", i)
				}
				got, err := binding.ToEvent(t.Context(), deliveryMessage{d})
				require.NoError(t, err)
				require.NoError(t, got.Validate())
				j := 0
				if got.ID() == ids[1] {
					j = 1
				}
				e := written[j]
				var created time.Time
				require.NoError(t, pool.QueryRow(t.Context(), `SELECT created_at FROM outbox WHERE event_id = $1`, ids[j]).Scan(&created))
				require.Equal(t, ids[j], got.ID())
				require.Equal(t, "1.0", got.SpecVersion())
				require.Equal(t, "https://orders.example.com", got.Source())
				require.Equal(t, e.AggregateType+"."+e.EventType, got.Type())
				require.Equal(t, e.AggregateID, got.Subject())
				require.True(t, got.Time().Equal(created), "time %s, created_at %s", got.Time(), created)
				if e.PayloadBytes != nil {
					require.Equal(t, e.ContentType, got.DataContentType())
					require.Equal(t, e.PayloadBytes, got.Data())
				} else {
					require.Equal(t, "application/json", got.DataContentType())
					want, err := json.Marshal(e.Payload)
					require.NoError(t, err)
					require.JSONEq(t, string(want), string(got.Data()))
				}
				traceparent, _ := d.Headers["traceparent"].(string)
				if mode == "cloudevents-structured" {
					traceparent, _ = got.Extensions()["traceparent"].(string)
				}
				require.Contains(t, traceparent, traceID.String(), "the producer's trace context")
			}
			p.Stop(60 * time.Second)
		})
	}
}
