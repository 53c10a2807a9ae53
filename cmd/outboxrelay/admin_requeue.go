package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/outboxrelay/outboxrelay/internal/admin"
	"github.com/outboxrelay/outboxrelay/internal/cli"
)

// RequeueCmd puts dead-lettered events back to pending.
type RequeueCmd struct {
	AdminFlags
	ChannelFlag
	IDs       []int64 `name:"id" help:"Requeue this event (its --column-id value); repeatable, or comma-separated."`
	EventType string  `name:"event-type" help:"Requeue every dead-lettered event of this type."`
	All       bool    `name:"all" help:"Requeue every dead-lettered event."`
	DryRun    bool    `name:"dry-run" help:"Show the events that would be requeued; change nothing."`
}

type requeueJSON struct {
	DryRun bool `json:"dry_run"`
	// Matched counts the dead-lettered events selected; Requeued those
	// put back (0 on a dry run).
	Matched  int64   `json:"matched"`
	Requeued int64   `json:"requeued"`
	IDs      []int64 `json:"ids"`
	// Missing are --id values naming no dead-lettered event.
	Missing []int64     `json:"missing_ids"`
	Events  []eventJSON `json:"events,omitempty"` // only on a dry run
}

// Run requeues (or, with --dry-run, lists) the selected events and notifies
// the relay's channel so a running relay claims them at once.
func (c *RequeueCmd) Run(ctx context.Context, stdout, stderr io.Writer) error {
	sel := admin.Selector{IDs: c.IDs, EventType: c.EventType, All: c.All}
	if err := sel.Validate(); err != nil {
		return cli.Usagef("requeue: choose exactly one of --id, --event-type or --all")
	}
	if err := c.check(); err != nil {
		return err
	}
	a, closeConn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeConn()
	res, err := a.Requeue(ctx, sel, admin.RequeueOptions{Channel: c.Channel, DryRun: c.DryRun})
	if err != nil {
		return c.tableError(err)
	}
	for _, id := range res.Missing {
		fmt.Fprintf(stderr, "outboxrelay: --id %d: no dead-lettered event with this id; left alone\n", id)
	}
	out := requeueJSON{DryRun: c.DryRun, Matched: int64(len(res.IDs)), IDs: res.IDs, Missing: res.Missing}
	if out.IDs == nil {
		out.IDs = []int64{}
	}
	if out.Missing == nil {
		out.Missing = []int64{}
	}
	if c.DryRun {
		out.Events = eventsJSON(res.Events)
	} else {
		out.Requeued = out.Matched
	}
	if c.JSON {
		return writeJSON(stdout, out)
	}
	if c.DryRun {
		if len(res.Events) > 0 {
			if err := writeEvents(stdout, res.Events, time.Now()); err != nil {
				return err
			}
		}
		fmt.Fprintf(stdout, "would requeue %d %s (dry run: nothing changed)\n", out.Matched, plural(out.Matched, "event"))
		return nil
	}
	fmt.Fprintf(stdout, "requeued %d %s\n", out.Requeued, plural(out.Requeued, "event"))
	return nil
}
