package testkit

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// OrderedFigures are what a consumer of an ordered run saw, held against
// the table.
type OrderedFigures struct {
	// Committed events; Delivered, the distinct ones that arrived; Lost,
	// those committed that did not; Duplicates, the copies beyond the
	// first.
	Committed, Delivered, Lost, Duplicates int
	// Violations are the first arrivals that came before one of their
	// aggregate's earlier events (OrderChecker's), then every aggregate
	// whose events did not all arrive.
	Violations []string
	// ByClass breaks the figures down by aggregate class.
	ByClass map[string]*ClassFigures
	// LastErrors counts the events that failed at least once, by their
	// last failure: nacked, returned, exchange not found, other.
	LastErrors map[string]int
}

// ClassFigures are OrderedFigures for one class of aggregates.
type ClassFigures struct {
	Aggregates, Committed, Delivered, Lost, Duplicates int
	// Done is when the class's last event was marked published, from the
	// start of the first relay.
	Done time.Duration
}

// Check holds what the tally saw against the table: every aggregate's
// committed events must have arrived, each first arrival after its
// predecessors'. It reads the table and does not fail the test: the caller
// asserts on the figures.
func (run *OrderedRun) Check(t testing.TB, tally *OrderTally) OrderedFigures {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := run.s.Pool.Query(ctx, `SELECT aggregate_type, aggregate_id, count(*), max((payload->>'seq')::int),
			coalesce(max(published_at), now())
		FROM outbox WHERE event_type = $1 GROUP BY 1, 2`, run.s.Tag)
	if err != nil {
		t.Fatalf("testkit: read the run's aggregates: %v", err)
	}
	type aggregate struct {
		class, id  string
		events, to int
		done       time.Time
	}
	var aggs []aggregate
	var a aggregate
	if _, err := pgx.ForEachRow(rows, []any{&a.class, &a.id, &a.events, &a.to, &a.done}, func() error {
		aggs = append(aggs, a)
		return nil
	}); err != nil {
		t.Fatalf("testkit: read the run's aggregates: %v", err)
	}

	tally.mu.Lock()
	defer tally.mu.Unlock()
	f := OrderedFigures{ByClass: map[string]*ClassFigures{}, LastErrors: map[string]int{}}
	f.Violations = slices.Clone(tally.check.Violations)
	var short []string
	for _, a := range aggs {
		c := f.ByClass[a.class]
		if c == nil {
			c = &ClassFigures{}
			f.ByClass[a.class] = c
		}
		arrived := tally.check.Arrived(a.class + "/" + a.id)
		c.Aggregates++
		c.Done = max(c.Done, a.done.Sub(run.start))
		c.Committed += a.events
		c.Delivered += min(arrived, a.events)
		if arrived < a.events {
			short = append(short, fmt.Sprintf("%s/%s: %d of %d events arrived", a.class, a.id, arrived, a.events))
		}
		if a.to != a.events {
			short = append(short, fmt.Sprintf("%s/%s: %d events committed, up to seq %d", a.class, a.id, a.events, a.to))
		}
	}
	sort.Strings(short)
	f.Violations = append(f.Violations, short...)
	for class, c := range f.ByClass {
		c.Lost = c.Committed - c.Delivered
		c.Duplicates = tally.deliveries[class] - c.Delivered
		f.Committed += c.Committed
		f.Delivered += c.Delivered
		f.Lost += c.Lost
	}
	f.Duplicates = tally.check.Duplicates

	rows, err = run.s.Pool.Query(ctx, `SELECT CASE
			WHEN last_error LIKE '%nacked%' THEN 'nacked'
			WHEN last_error LIKE '%returned%' THEN 'returned'
			WHEN last_error LIKE '%exchange not found%' THEN 'exchange not found'
			ELSE 'other' END, count(*)
		FROM outbox WHERE event_type = $1 AND last_error IS NOT NULL GROUP BY 1`, run.s.Tag)
	if err != nil {
		t.Fatalf("testkit: read the run's failures: %v", err)
	}
	var (
		kind string
		n    int
	)
	if _, err := pgx.ForEachRow(rows, []any{&kind, &n}, func() error {
		f.LastErrors[kind] = n
		return nil
	}); err != nil {
		t.Fatalf("testkit: read the run's failures: %v", err)
	}
	return f
}

// FirstViolations lists the first n violations, for a failure message.
func (f OrderedFigures) FirstViolations(n int) string {
	if len(f.Violations) <= n {
		return strings.Join(f.Violations, "; ")
	}
	return strings.Join(f.Violations[:n], "; ") + fmt.Sprintf("; and %d more", len(f.Violations)-n)
}

// String is the figures on one line, then each class's.
func (f OrderedFigures) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d committed, %d delivered, %d lost, %d duplicates, %d order violations; last failures %v",
		f.Committed, f.Delivered, f.Lost, f.Duplicates, len(f.Violations), f.LastErrors)
	for _, class := range []string{ClassPlain, ClassLate, ClassFull} {
		if c := f.ByClass[class]; c != nil {
			fmt.Fprintf(&b, "; %s: %d aggregates, %d committed, %d delivered, %d lost, %d duplicates, all published %s after the start",
				class, c.Aggregates, c.Committed, c.Delivered, c.Lost, c.Duplicates, c.Done.Round(100*time.Millisecond))
		}
	}
	return b.String()
}
