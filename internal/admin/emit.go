package admin

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// EmitOptions describe the test events Emit inserts.
type EmitOptions struct {
	AggregateType string // default "demo"
	AggregateID   string // default: the event's sequence number, 1, 2, …
	EventType     string // default "emitted"
	// Payload is the body of every event; default {"demo": true, "n": <the
	// event's sequence number>}.
	Payload json.RawMessage
	// Exchange and RoutingKey fill the per-event columns; "" leaves them
	// NULL, so the relay's defaults apply.
	Exchange   string
	RoutingKey string
	// Count is how many events to insert. 0 means one, or, with a Rate,
	// as many as fit before ctx ends.
	Count int64
	// Rate spreads the events at this many per second, the first at once;
	// 0 inserts them all at once.
	Rate float64
}

// emitChunk is the most events one INSERT writes.
const emitChunk = 1000

// emitTick is the shortest interval between two inserts at a rate: a
// higher rate inserts several events per tick.
const emitTick = 10 * time.Millisecond

// Emit inserts test events, as a producer would, and returns how many it
// inserted. With a Rate it inserts on a ticker until Count is reached or,
// without a Count, until ctx ends. When ctx ends first it returns what it
// inserted so far with ctx's error; an insert already under way is
// finished (each has its own timeout), so the count is exact.
func (a *Admin) Emit(ctx context.Context, opt EmitOptions) (int64, error) {
	switch {
	case opt.Count < 0:
		return 0, fmt.Errorf("emit: Count %d: must not be negative", opt.Count)
	case opt.Rate < 0:
		return 0, fmt.Errorf("emit: Rate %g: must not be negative", opt.Rate)
	case opt.Payload != nil && !json.Valid(opt.Payload):
		return 0, errors.New("emit: Payload is not valid JSON")
	}
	count := opt.Count
	if count == 0 && opt.Rate == 0 {
		count = 1
	}
	var emitted int64
	if opt.Rate == 0 {
		for emitted < count {
			if err := ctx.Err(); err != nil {
				return emitted, err
			}
			n := min(count-emitted, emitChunk)
			if err := a.insert(ctx, opt, emitted+1, emitted+n); err != nil {
				return emitted, err
			}
			emitted += n
		}
		return emitted, nil
	}

	interval := max(time.Duration(float64(time.Second)/opt.Rate), emitTick)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	start := time.Now()
	for {
		// The first event at once, then as many as the rate has made due.
		due := int64(opt.Rate*time.Since(start).Seconds()) + 1 - emitted
		if count > 0 {
			due = min(due, count-emitted)
		}
		for due > 0 {
			if err := ctx.Err(); err != nil {
				return emitted, err
			}
			n := min(due, emitChunk)
			if err := a.insert(ctx, opt, emitted+1, emitted+n); err != nil {
				return emitted, err
			}
			emitted += n
			due -= n
		}
		if count > 0 && emitted >= count {
			return emitted, nil
		}
		select {
		case <-ctx.Done():
			return emitted, ctx.Err()
		case <-tick.C:
		}
	}
}

// insert writes the events numbered first to last in one statement. It
// runs to its end even if ctx ends meanwhile, so that what Emit reports is
// what was committed.
func (a *Admin) insert(ctx context.Context, opt EmitOptions, first, last int64) error {
	ctx, cancel := a.timeout(context.WithoutCancel(ctx))
	defer cancel()
	var payload *string
	if opt.Payload != nil {
		payload = nullIf(string(opt.Payload))
	}
	_, err := a.db.Exec(ctx, a.q["emit"], cmp.Or(opt.AggregateType, "demo"), nullIf(opt.AggregateID),
		cmp.Or(opt.EventType, "emitted"), payload, nullIf(opt.Exchange), nullIf(opt.RoutingKey), first, last)
	if err != nil {
		return fmt.Errorf("emit: insert: %w", err)
	}
	return nil
}
