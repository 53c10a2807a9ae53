package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/outbox"
)

func traceparentOf(sc trace.SpanContext) string {
	return fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags())
}

// writeAndReadHeaders writes events in ctx to a fresh outbox and returns the
// stored headers of each, decoded (nil for NULL).
func writeAndReadHeaders(t *testing.T, ctx context.Context, events ...outbox.Event) []map[string]any {
	t.Helper()
	_, pool := testkit.NewOutbox(t)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return outbox.Writer{}.Write(ctx, tx, events...) }))
	rows, err := pool.Query(ctx, "SELECT headers FROM outbox ORDER BY id")
	require.NoError(t, err)
	headers, err := pgx.CollectRows(rows, pgx.RowTo[map[string]any])
	require.NoError(t, err)
	return headers
}

// With a span in ctx, every event carries its traceparent (W3C Trace
// Context, as no global propagator is set); the caller's headers are kept
// and their map is not modified; an event with a traceparent of its own
// keeps it.
func TestWriteAddsTraceContextOfTheSpan(t *testing.T) {
	t.Parallel()
	require.Empty(t, otel.GetTextMapPropagator().Fields(), "otel's default: no propagator set")
	provider := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewInMemoryExporter()))
	defer provider.Shutdown(context.Background())
	ctx, span := provider.Tracer("test").Start(testContext(t), "place order")
	defer span.End()
	want := traceparentOf(span.SpanContext())

	own := map[string]any{"tenant": "acme"}
	headers := writeAndReadHeaders(t, ctx,
		outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "created", Payload: 1},
		outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "paid", Payload: 2, Headers: own},
		outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "shipped", Payload: 3,
			Headers: map[string]any{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}},
	)
	require.Equal(t, []map[string]any{
		{"traceparent": want},
		{"traceparent": want, "tenant": "acme"},
		{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
	}, headers)
	require.Equal(t, map[string]any{"tenant": "acme"}, own, "the caller's map is unchanged")
}

// Without a span, or with an invalid span context, nothing is added: events
// without headers keep NULL.
func TestWriteWithoutSpanAddsNothing(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	noop := trace.ContextWithSpanContext(ctx, trace.SpanContext{})
	_, pool := testkit.NewOutbox(t)
	for _, c := range []context.Context{ctx, noop} {
		require.NoError(t, pgx.BeginFunc(c, pool, func(tx pgx.Tx) error {
			return outbox.Writer{}.Write(c, tx,
				outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "created", Payload: 1},
				outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "paid", Payload: 1, Headers: map[string]any{"a": "b"}})
		}))
	}
	require.Equal(t, int64(2), testkit.QueryInt(t, pool, "SELECT count(*) FROM outbox WHERE headers IS NULL"))
	require.Equal(t, int64(2), testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE headers = '{"a": "b"}'`))
}

// A remote span context with a trace state gives tracestate too.
func TestWriteAddsTraceState(t *testing.T) {
	t.Parallel()
	state, err := trace.ParseTraceState("vendor=abc,other=1")
	require.NoError(t, err)
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled,
		TraceState: state, Remote: true,
	})
	ctx := trace.ContextWithRemoteSpanContext(testContext(t), sc)
	headers := writeAndReadHeaders(t, ctx, outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "created", Payload: 1})
	require.Equal(t, []map[string]any{{
		"traceparent": "00-01020300000000000000000000000000-0405060000000000-01",
		"tracestate":  "vendor=abc,other=1",
	}}, headers)
}

// The global propagator is used once set: here a composite that also
// carries baggage. Setting it is process-wide and cannot be undone (otel's
// default delegates to the first one set), so the test runs in a process of
// its own, and the other tests see otel's default.
func TestWriteUsesTheGlobalPropagator(t *testing.T) {
	t.Parallel()
	if os.Getenv("OUTBOX_TEST_GLOBAL_PROPAGATOR") == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestWriteUsesTheGlobalPropagator$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "OUTBOX_TEST_GLOBAL_PROPAGATOR=1")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), "--- PASS: TestWriteUsesTheGlobalPropagator")
		return
	}
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))

	member, err := baggage.NewMember("tenant", "acme")
	require.NoError(t, err)
	bag, err := baggage.New(member)
	require.NoError(t, err)
	provider := sdktrace.NewTracerProvider()
	defer provider.Shutdown(context.Background())
	ctx, span := provider.Tracer("test").Start(baggage.ContextWithBaggage(testContext(t), bag), "op")
	defer span.End()

	headers := writeAndReadHeaders(t, ctx, outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "created", Payload: json.RawMessage(`{}`)})
	require.Equal(t, []map[string]any{{"traceparent": traceparentOf(span.SpanContext()), "baggage": "tenant=acme"}}, headers)
}
