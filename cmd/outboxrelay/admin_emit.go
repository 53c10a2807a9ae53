package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/outboxrelay/outboxrelay/internal/admin"
	"github.com/outboxrelay/outboxrelay/internal/cli"
)

// EmitCmd inserts test events.
type EmitCmd struct {
	AdminFlags
	Count         int64   `name:"count" help:"How many events (default: 1, or until SIGINT/SIGTERM with --rate)."`
	Rate          float64 `name:"rate" help:"Events per second, the first at once (default: all at once)."`
	AggregateType string  `name:"aggregate-type" default:"demo" help:"The events' aggregate type."`
	AggregateID   string  `name:"aggregate-id" help:"The events' aggregate id (default: each event's number, 1, 2, …)."`
	EventType     string  `name:"event-type" default:"emitted" help:"The events' type."`
	Payload       string  `name:"payload" help:"The events' JSON payload (default: {\"demo\": true, \"n\": <the event's number>})."`
	Exchange      string  `name:"exchange" help:"Fill the per-event exchange column (default: NULL, the relay's --exchange)."`
	RoutingKey    string  `name:"routing-key" help:"Fill the per-event routing key column (default: NULL, <aggregate type>.<event type>)."`
}

// Run inserts the events and prints how many. SIGINT or SIGTERM stops it
// cleanly: what was inserted is counted and the exit code is 0.
func (c *EmitCmd) Run(ctx context.Context, stdout, stderr io.Writer) error {
	switch {
	case c.Count < 0:
		return cli.Usagef("--count %d: must not be negative", c.Count)
	case c.Rate < 0:
		return cli.Usagef("--rate %g: must not be negative", c.Rate)
	case c.Payload != "" && !json.Valid([]byte(c.Payload)):
		return cli.Usagef("--payload: not valid JSON")
	}
	a, closeConn, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer closeConn()
	opt := admin.EmitOptions{
		AggregateType: c.AggregateType, AggregateID: c.AggregateID, EventType: c.EventType,
		Exchange: c.Exchange, RoutingKey: c.RoutingKey, Count: c.Count, Rate: c.Rate,
	}
	if c.Payload != "" {
		opt.Payload = json.RawMessage(c.Payload)
	}
	n, err := a.Emit(ctx, opt)
	stopped := err != nil && ctx.Err() != nil
	if err != nil && !stopped {
		if n > 0 {
			fmt.Fprintf(stderr, "outboxrelay: inserted %d %s before the error\n", n, plural(n, "event"))
		}
		return c.tableError(err)
	}
	if stopped && c.Count > 0 {
		fmt.Fprintf(stderr, "outboxrelay: stopped after %d of %d events\n", n, c.Count)
	}
	if c.JSON {
		return writeJSON(stdout, struct {
			Inserted int64 `json:"inserted"`
		}{n})
	}
	fmt.Fprintf(stdout, "inserted %d %s\n", n, plural(n, "event"))
	return nil
}
