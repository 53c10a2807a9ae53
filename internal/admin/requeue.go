package admin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/outboxrelay/outboxrelay/notify"
)

// Selector chooses the dead-lettered events to requeue: exactly one of its
// fields is set.
type Selector struct {
	IDs       []int64 // these events (their id column)
	EventType string  // every dead-lettered event of this type
	All       bool    // every dead-lettered event
}

// ErrSelector is returned for a Selector that sets none or several of its
// fields.
var ErrSelector = errors.New("requeue: choose exactly one of IDs, EventType or All")

// Validate reports whether exactly one field is set.
func (s Selector) Validate() error {
	n := 0
	for _, set := range []bool{len(s.IDs) > 0, s.EventType != "", s.All} {
		if set {
			n++
		}
	}
	if n != 1 {
		return ErrSelector
	}
	return nil
}

// RequeueOptions tune Requeue.
type RequeueOptions struct {
	// Channel is the relay's notification channel, woken after the update
	// so that a running relay claims the events at once rather than at its
	// fallback poll. Default "outbox".
	Channel string
	// DryRun changes nothing: the result lists the events that would be
	// requeued.
	DryRun bool
}

// RequeueResult is what Requeue did, or would do.
type RequeueResult struct {
	IDs []int64 // the events requeued (or that would be), in id order
	// Events are those events as they are now; only for a dry run.
	Events []Event
	// Missing are the ids of Selector.IDs that name no dead-lettered event
	// (absent, pending or published); they are left alone.
	Missing []int64
}

// Requeue puts the selected dead-lettered events back to pending as new:
// attempts 0, due now, no lease, last_error kept. In the same transaction
// it notifies the relay's channel, so the relays claim them as soon as it
// commits. Nothing selected is not an error.
func (a *Admin) Requeue(ctx context.Context, sel Selector, opt RequeueOptions) (RequeueResult, error) {
	if err := sel.Validate(); err != nil {
		return RequeueResult{}, err
	}
	st := a.cfg.Statuses
	var ids []int64
	if len(sel.IDs) > 0 {
		ids = sel.IDs
	}
	eventType := nullIf(sel.EventType)
	ctx, cancel := a.timeout(ctx)
	defer cancel()

	var res RequeueResult
	if opt.DryRun {
		rows, err := a.db.Query(ctx, a.q["requeue_preview"], st.Failed, ids, eventType)
		if err != nil {
			return RequeueResult{}, fmt.Errorf("requeue: preview: %w", err)
		}
		if res.Events, _, err = events(rows); err != nil {
			return RequeueResult{}, fmt.Errorf("requeue: preview: %w", err)
		}
		res.IDs = make([]int64, len(res.Events))
		for i, e := range res.Events {
			res.IDs[i] = e.ID
		}
	} else {
		err := pgx.BeginFunc(ctx, a.db, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, a.q["requeue"], st.Pending, st.Failed, ids, eventType)
			if err != nil {
				return err
			}
			if res.IDs, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
				return err
			}
			if len(res.IDs) == 0 {
				return nil
			}
			_, err = tx.Exec(ctx, a.q["notify"], cmp.Or(opt.Channel, "outbox"), notify.RequeuePayload)
			return err
		})
		if err != nil {
			return RequeueResult{}, fmt.Errorf("requeue: %w", err)
		}
		slices.Sort(res.IDs)
	}
	for _, id := range sel.IDs {
		if _, found := slices.BinarySearch(res.IDs, id); !found && !slices.Contains(res.Missing, id) {
			res.Missing = append(res.Missing, id)
		}
	}
	return res, nil
}
