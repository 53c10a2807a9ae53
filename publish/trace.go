package publish

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Attributes of the PRODUCER spans, after OpenTelemetry's messaging
// conventions for RabbitMQ.
var (
	attrSystem        = attribute.String("messaging.system", "rabbitmq")
	attrOperationName = attribute.String("messaging.operation.name", "publish")
	attrOperationType = attribute.String("messaging.operation.type", "send")
)

// headerCarrier reads and writes trace context in a message's AMQP
// headers.
type headerCarrier amqp.Table

func (c headerCarrier) Get(key string) string {
	s, _ := c[key].(string)
	return s
}

func (c headerCarrier) Set(key, value string) { c[key] = value }

func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// startSpans starts one PRODUCER span per message, each a child of the
// trace context in the message's headers (the producer's, put there by
// package outbox or by hand), and replaces that context in the headers by
// the span's own, so a consumer continues the trace from the publish. It
// returns nil when tracing is off.
func (p *Publisher) startSpans(ctx context.Context, msgs []Message, exchanges []string) []trace.Span {
	if p.cfg.Tracer == nil {
		return nil
	}
	prop := p.cfg.Propagator
	if prop == nil {
		prop = propagation.TraceContext{}
	}
	spans := make([]trace.Span, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		if m.Headers == nil {
			m.Headers = amqp.Table{}
		}
		parent := prop.Extract(ctx, headerCarrier(m.Headers))
		attrs := []attribute.KeyValue{
			attrSystem, attrOperationName, attrOperationType,
			attribute.String("messaging.destination.name", exchanges[i]),
			attribute.String("messaging.message.id", m.MessageID),
			attribute.Int("messaging.message.body.size", len(m.Body)),
		}
		if m.RoutingKey != "" {
			attrs = append(attrs, attribute.String("messaging.rabbitmq.destination.routing_key", m.RoutingKey))
		}
		spanCtx, span := p.cfg.Tracer.Start(parent, "publish "+exchanges[i]+":"+m.RoutingKey,
			trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
		prop.Inject(spanCtx, headerCarrier(m.Headers))
		spans[i] = span
	}
	return spans
}

// endSpans ends the spans with each message's result: a failure sets the
// span's status and its error.type, the failure's Reason (the word the
// relay's metrics and logs use for it).
func endSpans(spans []trace.Span, errs []error) {
	for i, span := range spans {
		if err := errs[i]; err != nil {
			span.SetAttributes(attribute.String("error.type", Reason(err)))
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}
