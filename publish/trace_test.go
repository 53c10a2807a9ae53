package publish

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// TestProducerSpansContinueTheEventsTrace publishes, with a tracer, a
// message carrying a producer's traceparent and an unroutable one: each
// gets a PRODUCER span, a child of its producer's span, and the consumer
// receives the publish span's context in place of the producer's.
func TestProducerSpansContinueTheEventsTrace(t *testing.T) {
	t.Parallel()
	exporter := tracetest.NewInMemoryExporter()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "order.#")
	p := start(t, Config{Exchange: exchange, Tracer: provider.Tracer("test")})

	// The producer's span, as package outbox writes it into the headers.
	_, producer := provider.Tracer("app").Start(context.Background(), "checkout")
	producer.End()
	parent := producer.SpanContext()
	traceparent := "00-" + parent.TraceID().String() + "-" + parent.SpanID().String() + "-01"

	msgs := batch(2, "order.created")
	msgs[0].Headers = amqp.Table{"traceparent": traceparent, "tenant": "acme"}
	msgs[1].RoutingKey = "nowhere"
	errs := p.Publish(context.Background(), msgs)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], ErrReturned)

	spans := exporter.GetSpans()
	var publishSpans tracetest.SpanStubs
	for _, s := range spans {
		if s.SpanKind == trace.SpanKindProducer {
			publishSpans = append(publishSpans, s)
		}
	}
	require.Len(t, publishSpans, 2)
	byID := map[string]tracetest.SpanStub{}
	for _, s := range publishSpans {
		for _, a := range s.Attributes {
			if a.Key == "messaging.message.id" {
				byID[a.Value.AsString()] = s
			}
		}
	}
	ok := byID[msgs[0].MessageID]
	require.Equal(t, "publish "+exchange+":order.created", ok.Name)
	require.Equal(t, parent.TraceID(), ok.SpanContext.TraceID(), "the publish continues the producer's trace")
	require.Equal(t, parent.SpanID(), ok.Parent.SpanID(), "a child of the producer's span")
	require.Contains(t, ok.Attributes, attribute.String("messaging.system", "rabbitmq"))
	require.Contains(t, ok.Attributes, attribute.String("messaging.destination.name", exchange))
	require.Contains(t, ok.Attributes, attribute.String("messaging.rabbitmq.destination.routing_key", "order.created"))
	require.Equal(t, codes.Unset, ok.Status.Code)

	returned := byID[msgs[1].MessageID]
	require.False(t, returned.Parent.IsValid(), "no producer context: a root span")
	require.Equal(t, codes.Error, returned.Status.Code)
	require.Contains(t, returned.Attributes, attribute.String("error.type", "returned"))

	d := queue.Receive(t, 1, 10*time.Second)[0]
	require.Equal(t, "acme", d.Headers["tenant"])
	got := d.Headers["traceparent"].(string)
	require.Equal(t, "00-"+ok.SpanContext.TraceID().String()+"-"+ok.SpanContext.SpanID().String()+"-01", got,
		"the consumer continues from the publish span")
}

// TestNoTracerLeavesHeadersAlone: without a tracer the producer's
// traceparent reaches the consumer as it was written.
func TestNoTracerLeavesHeadersAlone(t *testing.T) {
	t.Parallel()
	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "#")
	p := start(t, Config{Exchange: exchange})
	const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	msgs := batch(1, "order.created")
	msgs[0].Headers = amqp.Table{"traceparent": traceparent}
	require.NoError(t, p.Publish(context.Background(), msgs)[0])
	require.Equal(t, traceparent, queue.Receive(t, 1, 10*time.Second)[0].Headers["traceparent"])
}
