// Command app is an application that uses the producer library and nothing
// of the relay. Two tests build it in a module of its own whose go.mod
// requires only the library: the library's module test
// (outbox/module_test.go), which checks that module's graph, and the
// relay's end-to-end test (cmd/outboxrelay/outbox_app_test.go), which runs
// a relay that publishes what it wrote.
//
// In a span, it writes two events with pgx and one with database/sql
// (pgx's stdlib driver), and writes two more in transactions it rolls back;
// it prints the span's traceparent. The span's context is made with the
// OpenTelemetry API, as an application's tracer would make it.
package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxrelay/outboxrelay/outbox"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: app DATABASE_URL")
		os.Exit(2)
	}
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(databaseURL string) error {
	otel.SetTextMapPropagator(propagation.TraceContext{})
	var traceID trace.TraceID
	var spanID trace.SpanID
	if _, err := rand.Read(traceID[:]); err != nil {
		return err
	}
	if _, err := rand.Read(spanID[:]); err != nil {
		return err
	}
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled,
	}))

	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	db, err := sql.Open("pgx", databaseURL)
	if err != nil {
		return err
	}
	defer db.Close()
	var w outbox.Writer

	// Committed, with pgx.
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := w.Write(ctx, tx,
			outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "created", Payload: map[string]int{"id": 1}},
			outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "paid", Payload: map[string]int{"id": 1},
				Headers: map[string]any{"tenant": "acme"}})
		return err
	}); err != nil {
		return fmt.Errorf("write with pgx: %w", err)
	}
	// Committed, with database/sql.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if _, err := w.WriteSQL(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "2", EventType: "created", Payload: map[string]int{"id": 2}}); err != nil {
		return fmt.Errorf("write with database/sql: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	// Rolled back, with each.
	ptx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	if _, err := w.Write(ctx, ptx, outbox.Event{AggregateType: "order", AggregateID: "3", EventType: "created", Payload: 3}); err != nil {
		return err
	}
	if err := ptx.Rollback(ctx); err != nil {
		return err
	}
	stx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if _, err := w.WriteSQL(ctx, stx, outbox.Event{AggregateType: "order", AggregateID: "4", EventType: "created", Payload: 4}); err != nil {
		return err
	}
	if err := stx.Rollback(); err != nil {
		return err
	}

	carrier := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(ctx, carrier)
	fmt.Println(carrier["traceparent"])
	return nil
}
