package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outboxrelay/outbox"
)

// The tests need a span context in ctx, not a tracer: an application's
// tracer (the OpenTelemetry SDK's or another) puts its span's context there,
// and the library reads nothing else. So they make one with the API alone,
// as an SDK would, and keep the SDK out of the library's module.

// spanContext is a valid, sampled span context of the given trace and span.
func spanContext(traceID trace.TraceID, spanID trace.SpanID) trace.SpanContext {
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled})
}

func traceparentOf(sc trace.SpanContext) string {
	return fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags())
}

// writeAndReadHeaders writes events in ctx to a fresh outbox and returns the
// stored headers of each, decoded (nil for NULL).
func writeAndReadHeaders(t *testing.T, ctx context.Context, events ...outbox.Event) []map[string]any {
	t.Helper()
	_, pool := newOutbox(t)
	must(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Writer{}.Write(ctx, tx, events...)
		return err
	}), "Write")
	return readHeaders(t, ctx, pool)
}

// readHeaders returns the stored headers of the outbox's rows in id order,
// decoded (nil for NULL).
func readHeaders(t *testing.T, ctx context.Context, pool *pgxpool.Pool) []map[string]any {
	t.Helper()
	rows, err := pool.Query(ctx, "SELECT headers FROM outbox ORDER BY id")
	must(t, err, "select the headers")
	headers, err := pgx.CollectRows(rows, pgx.RowTo[map[string]any])
	must(t, err, "read the headers")
	return headers
}

// With a span in ctx, every event carries its traceparent (W3C Trace
// Context, as no global propagator is set); the caller's headers are kept
// and their map is not modified; an event with a traceparent of its own
// keeps it.
func TestWriteAddsTraceContextOfTheSpan(t *testing.T) {
	t.Parallel()
	if fields := otel.GetTextMapPropagator().Fields(); len(fields) != 0 {
		t.Fatalf("a global propagator is set (fields %q); the test wants otel's default, none", fields)
	}
	sc := spanContext(trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7})
	ctx := trace.ContextWithSpanContext(testContext(t), sc)
	want := traceparentOf(sc)
	equal(t, "traceparent", want, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")

	own := map[string]any{"tenant": "acme"}
	headers := writeAndReadHeaders(t, ctx,
		outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "created", Payload: 1},
		outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "paid", Payload: 2, Headers: own},
		outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "shipped", Payload: 3,
			Headers: map[string]any{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}},
	)
	equal(t, "headers", headers, []map[string]any{
		{"traceparent": want},
		{"traceparent": want, "tenant": "acme"},
		{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
	})
	equal(t, "the caller's map, unchanged", own, map[string]any{"tenant": "acme"})
}

// Without a span, or with an invalid span context, nothing is added: events
// without headers keep NULL.
func TestWriteWithoutSpanAddsNothing(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	noop := trace.ContextWithSpanContext(ctx, trace.SpanContext{})
	_, pool := newOutbox(t)
	for _, c := range []context.Context{ctx, noop} {
		must(t, pgx.BeginFunc(c, pool, func(tx pgx.Tx) error {
			_, err := outbox.Writer{}.Write(c, tx,
				outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "created", Payload: 1},
				outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "paid", Payload: 1, Headers: map[string]any{"a": "b"}})
			return err
		}), "Write")
	}
	equal(t, "events without headers", queryInt(t, pool, "SELECT count(*) FROM outbox WHERE headers IS NULL"), 2)
	equal(t, "events with only their own headers", queryInt(t, pool, `SELECT count(*) FROM outbox WHERE headers = '{"a": "b"}'`), 2)
}

// A remote span context with a trace state gives tracestate too.
func TestWriteAddsTraceState(t *testing.T) {
	t.Parallel()
	state, err := trace.ParseTraceState("vendor=abc,other=1")
	must(t, err, "parse the trace state")
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled,
		TraceState: state, Remote: true,
	})
	ctx := trace.ContextWithRemoteSpanContext(testContext(t), sc)
	headers := writeAndReadHeaders(t, ctx, outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "created", Payload: 1})
	equal(t, "headers", headers, []map[string]any{{
		"traceparent": "00-01020300000000000000000000000000-0405060000000000-01",
		"tracestate":  "vendor=abc,other=1",
	}})
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
		must(t, err, "the test in a process of its own:\n"+string(out))
		if !strings.Contains(string(out), "--- PASS: TestWriteUsesTheGlobalPropagator") {
			t.Fatalf("the test did not run in its own process:\n%s", out)
		}
		return
	}
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))

	member, err := baggage.NewMember("tenant", "acme")
	must(t, err, "baggage member")
	bag, err := baggage.New(member)
	must(t, err, "baggage")
	sc := spanContext(trace.TraceID{0xa1, 0xb2, 0xc3}, trace.SpanID{0xd4, 0xe5})
	ctx := trace.ContextWithSpanContext(baggage.ContextWithBaggage(testContext(t), bag), sc)

	headers := writeAndReadHeaders(t, ctx, outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "created", Payload: json.RawMessage(`{}`)})
	equal(t, "headers", headers, []map[string]any{{"traceparent": traceparentOf(sc), "baggage": "tenant=acme"}})
}

// Writer.Propagator replaces the global one: a propagator of its own (here
// baggage only) writes what it propagates, and one that propagates nothing
// turns the trace context off, while the global propagator (otel's
// default, which the fallback turns into W3C Trace Context) would write a
// traceparent.
func TestWriterPropagatorOverridesTheGlobalOne(t *testing.T) {
	t.Parallel()
	member, err := baggage.NewMember("tenant", "acme")
	must(t, err, "baggage member")
	bag, err := baggage.New(member)
	must(t, err, "baggage")
	sc := spanContext(trace.TraceID{0x11, 0x22}, trace.SpanID{0x33})
	ctx := trace.ContextWithSpanContext(baggage.ContextWithBaggage(testContext(t), bag), sc)
	_, pool := newOutbox(t)
	e := outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "created", Payload: 1}
	for _, w := range []outbox.Writer{
		{},
		{Propagator: propagation.Baggage{}},
		{Propagator: propagation.NewCompositeTextMapPropagator()},
	} {
		must(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := w.Write(ctx, tx, e)
			return err
		}), "Write")
	}
	equal(t, "headers", readHeaders(t, ctx, pool), []map[string]any{
		{"traceparent": traceparentOf(sc)},
		{"baggage": "tenant=acme"},
		nil,
	})
}
