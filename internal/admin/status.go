package admin

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/claim"
)

// Status is the state of the outbox.
type Status struct {
	Pending   int64 // waiting, retrying or in flight
	Published int64 // confirmed and not cleaned up yet
	Failed    int64 // dead-lettered
	InFlight  int64 // pending rows a live lease holds
	Retrying  int64 // pending rows waiting for their retry delay
	Scheduled int64 // pending rows never attempted, waiting for their time
	// OldestPending is the age of the oldest pending event due or
	// attempted (by its created_at, or its time if it was scheduled); nil
	// when there is none.
	OldestPending *time.Duration
	// FailedByEventType counts dead-lettered events per event type, most
	// first.
	FailedByEventType []EventTypeCount
	// Blocked lists the aggregates a dead-lettered event holds back; nil
	// unless claims are ordered (claim.OrderAggregate) under
	// claim.DeadLetterBlock.
	Blocked *Blocked
}

// EventTypeCount is how many events of one type.
type EventTypeCount struct {
	EventType string
	Count     int64
}

// Blocked are the aggregates whose head (first pending or failed event, by
// id) is dead-lettered, so that their later events wait in ordered mode.
type Blocked struct {
	Aggregates int64              // how many aggregates are blocked
	Waiting    int64              // pending events behind their heads
	First      []BlockedAggregate // the first BlockedSample of them, by the head's id
}

// BlockedAggregate is one blocked aggregate.
type BlockedAggregate struct {
	Key       []*string // the ordering key's values as text; nil for NULL
	FailedID  int64     // the dead-lettered head
	EventType string    // the head's event type
	Waiting   int64     // pending events behind it
}

// BlockedSample is how many blocked aggregates Status lists.
const BlockedSample = 10

// Status counts the events by status, measures the oldest pending one,
// counts dead-lettered events by type and, in ordered mode under the block
// policy, finds the blocked aggregates. Each status is counted through its
// partial index; counting the published rows, kept for the retention
// period, takes longest.
func (a *Admin) Status(ctx context.Context) (Status, error) {
	st := a.cfg.Statuses
	var s Status
	var age *float64
	err := a.one(ctx, "status", func(row pgx.Row) error {
		return row.Scan(&s.Pending, &s.Published, &s.Failed, &s.InFlight, &s.Retrying, &s.Scheduled, &age)
	}, st.Pending, st.Published, st.Failed)
	if err != nil {
		return Status{}, err
	}
	if age != nil {
		// A clock ahead of the database's can date an event in the future.
		d := max(time.Duration(*age*float64(time.Second)), 0)
		s.OldestPending = &d
	}

	qctx, cancel := a.timeout(ctx)
	defer cancel()
	rows, err := a.db.Query(qctx, a.q["failed_by_event_type"], st.Failed)
	if err == nil {
		s.FailedByEventType, err = pgx.CollectRows(rows, pgx.RowToStructByPos[EventTypeCount])
	}
	if err != nil {
		return Status{}, fmt.Errorf("status: failed events by type: %w", err)
	}

	if a.cfg.Ordered() && a.cfg.OrderedDeadLetter == claim.DeadLetterBlock {
		b, err := a.blocked(ctx)
		if err != nil {
			return Status{}, err
		}
		s.Blocked = &b
	}
	return s, nil
}

func (a *Admin) blocked(ctx context.Context) (Blocked, error) {
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	st := a.cfg.Statuses
	rows, err := a.db.Query(ctx, a.q["blocked"], st.Pending, st.Failed, BlockedSample)
	if err != nil {
		return Blocked{}, fmt.Errorf("status: blocked aggregates: %w", err)
	}
	b := Blocked{First: []BlockedAggregate{}}
	_, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (struct{}, error) {
		var ag BlockedAggregate
		err := row.Scan(&ag.Key, &ag.FailedID, &ag.EventType, &ag.Waiting, &b.Aggregates, &b.Waiting)
		b.First = append(b.First, ag)
		return struct{}{}, err
	})
	if err != nil {
		return Blocked{}, fmt.Errorf("status: blocked aggregates: %w", err)
	}
	return b, nil
}

// one runs the named statement, which returns exactly one row, under its
// timeout.
func (a *Admin) one(ctx context.Context, name string, scan func(pgx.Row) error, args ...any) error {
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	rows, err := a.db.Query(ctx, a.q[name], args...)
	if err == nil {
		_, err = pgx.CollectExactlyOneRow(rows, func(row pgx.CollectableRow) (struct{}, error) {
			return struct{}{}, scan(row)
		})
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}
