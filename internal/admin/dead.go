package admin

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// DeadFilter selects dead-lettered events; zero fields select any.
type DeadFilter struct {
	EventType     string
	AggregateType string
	AggregateID   string
	// OlderThan keeps events created at least this long ago.
	OlderThan time.Duration
	// Limit is the most events returned; 0 returns all.
	Limit int
}

// DeadList is a page of dead-lettered events.
type DeadList struct {
	Events []Event // in id order, at most the filter's limit
	Total  int64   // every event the filter matched, whatever the limit
}

// Dead lists the dead-lettered events the filter selects, oldest id first.
func (a *Admin) Dead(ctx context.Context, f DeadFilter) (DeadList, error) {
	if f.Limit < 0 || f.OlderThan < 0 {
		return DeadList{}, errors.New("dead: Limit and OlderThan must not be negative")
	}
	var olderThan *int64
	if f.OlderThan > 0 {
		olderThan = nullIf(f.OlderThan.Milliseconds())
	}
	ctx, cancel := a.timeout(ctx)
	defer cancel()
	rows, err := a.db.Query(ctx, a.q["dead"], a.cfg.Statuses.Failed,
		nullIf(f.EventType), nullIf(f.AggregateType), nullIf(f.AggregateID), olderThan, nullIf(int64(f.Limit)))
	if err != nil {
		return DeadList{}, fmt.Errorf("dead: %w", err)
	}
	evs, total, err := events(rows)
	if err != nil {
		return DeadList{}, fmt.Errorf("dead: %w", err)
	}
	return DeadList{Events: evs, Total: total}, nil
}
