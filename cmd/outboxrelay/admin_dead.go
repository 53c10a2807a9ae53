package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/outboxrelay/outboxrelay/internal/admin"
	"github.com/outboxrelay/outboxrelay/internal/cli"
)

// DeadCmd lists dead-lettered events.
type DeadCmd struct {
	AdminFlags
	EventType     string        `name:"event-type" help:"Only events of this type."`
	AggregateType string        `name:"aggregate-type" help:"Only events of this aggregate type."`
	AggregateID   string        `name:"aggregate-id" help:"Only events of this aggregate id."`
	OlderThan     time.Duration `name:"older-than" help:"Only events created at least this long ago (e.g. 1h)."`
	Limit         int           `name:"limit" default:"100" help:"Most events listed; 0 lists all."`
}

// Run prints the dead-lettered events the filters select, oldest id first,
// and on stderr how many more the limit left out.
func (c *DeadCmd) Run(ctx context.Context, stdout, stderr io.Writer) error {
	switch {
	case c.Limit < 0:
		return cli.Usagef("--limit %d: must not be negative", c.Limit)
	case c.OlderThan < 0:
		return cli.Usagef("--older-than %s: must not be negative", c.OlderThan)
	}
	a, closeConn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeConn()
	list, err := a.Dead(ctx, admin.DeadFilter{
		EventType: c.EventType, AggregateType: c.AggregateType, AggregateID: c.AggregateID,
		OlderThan: c.OlderThan, Limit: c.Limit,
	})
	if err != nil {
		return c.tableError(err)
	}
	if more := list.Total - int64(len(list.Events)); more > 0 {
		fmt.Fprintf(stderr, "outboxrelay: %d of %d dead-lettered events listed; --limit shows more\n", len(list.Events), list.Total)
	}
	if c.JSON {
		return writeJSON(stdout, eventsJSON(list.Events))
	}
	if len(list.Events) == 0 {
		fmt.Fprintln(stdout, "no dead-lettered events")
		return nil
	}
	return writeEvents(stdout, list.Events, time.Now())
}
