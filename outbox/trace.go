package outbox

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

const headerTraceparent = "traceparent"

// traceHeaders returns the headers that carry ctx's span context, or nil
// when ctx has no valid span context. They come from p; when p is nil, from
// the global propagator, or, while none is set (otel's default propagates
// nothing), from W3C Trace Context, so traceparent and tracestate are
// written out of the box.
func traceHeaders(ctx context.Context, p propagation.TextMapPropagator) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	if p == nil {
		p = otel.GetTextMapPropagator()
		if len(p.Fields()) == 0 {
			p = propagation.TraceContext{}
		}
	}
	carrier := propagation.MapCarrier{}
	p.Inject(ctx, carrier)
	if len(carrier) == 0 {
		return nil
	}
	return carrier
}
