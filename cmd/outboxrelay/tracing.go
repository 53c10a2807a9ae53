package main

import (
	"cmp"
	"context"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outboxrelay/internal/cli"
)

// tracingShutdownTimeout bounds the flush of the last spans at exit.
const tracingShutdownTimeout = 5 * time.Second

// tracing configures OpenTelemetry from the standard OTEL_* environment:
// tracing is on when an OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT
// or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) or OTEL_TRACES_EXPORTER=otlp, and
// off when OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none. The
// exporter speaks OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL: http/protobuf (the
// default) or grpc, and reads its other OTEL_EXPORTER_OTLP_* settings
// itself; the sampler follows OTEL_TRACES_SAMPLER, the resource
// OTEL_SERVICE_NAME (default outboxrelay) and OTEL_RESOURCE_ATTRIBUTES.
// It returns a nil tracer when tracing is off: the publisher then does no
// tracing work at all.
func tracing(ctx context.Context, log *slog.Logger) (trace.Tracer, propagation.TextMapPropagator, func(), error) {
	env := func(k string) string { return strings.TrimSpace(os.Getenv(k)) }
	exporter := strings.ToLower(env("OTEL_TRACES_EXPORTER"))
	endpoint := env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") + env("OTEL_EXPORTER_OTLP_ENDPOINT")
	switch {
	case strings.EqualFold(env("OTEL_SDK_DISABLED"), "true"), exporter == "none":
		return nil, nil, func() {}, nil
	case exporter == "" && endpoint == "":
		return nil, nil, func() {}, nil
	case exporter != "" && exporter != "otlp":
		return nil, nil, nil, cli.Usagef("OTEL_TRACES_EXPORTER=%s: only otlp and none are supported", exporter)
	}
	protocol := strings.ToLower(env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"))
	if protocol == "" {
		protocol = strings.ToLower(env("OTEL_EXPORTER_OTLP_PROTOCOL"))
	}
	var (
		exp sdktrace.SpanExporter
		err error
	)
	switch protocol {
	case "", "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, nil, nil, cli.Usagef("OTEL_EXPORTER_OTLP_PROTOCOL=%s: want http/protobuf or grpc", protocol)
	}
	if err != nil {
		return nil, nil, nil, cli.Usagef("OpenTelemetry exporter: %v", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "outboxrelay"), attribute.String("service.version", version())),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, nil, nil, cli.Usagef("OpenTelemetry resource (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME): %v", err)
	}
	provider := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("OpenTelemetry export failed", "err", err)
	}))
	log.Info("tracing on: a PRODUCER span per message", "protocol", cmp.Or(protocol, "http/protobuf"))
	shutdown := func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tracingShutdownTimeout)
		defer cancel()
		if err := provider.Shutdown(ctx); err != nil {
			log.Warn("flushing the last spans failed", "err", err)
		}
	}
	return provider.Tracer("github.com/outboxrelay/outboxrelay/publish"), prop, shutdown, nil
}
