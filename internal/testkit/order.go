package testkit

import (
	"encoding/json"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// OrderChecker checks the consumer-visible property of ordered mode:
// within every aggregate, the first arrival of each event follows the first
// arrival of each of its predecessors. Events carry their aggregate in the
// aggregate_type and aggregate_id headers the relay sets, and their place
// in the aggregate as "seq" in a JSON payload (1, 2, …, as the producer
// wrote them). Duplicates are allowed; a first arrival out of order is not.
type OrderChecker struct {
	seen  map[string]bool  // message ids seen
	last  map[string]int64 // aggregate -> highest seq whose first arrival was seen
	count map[string]int   // aggregate -> first arrivals
	// Violations describe each first arrival that came before one of its
	// predecessors' first arrivals.
	Violations []string
	// Duplicates counts deliveries of a message id seen before.
	Duplicates int
}

// NewOrderChecker returns an empty checker.
func NewOrderChecker() *OrderChecker {
	return &OrderChecker{seen: map[string]bool{}, last: map[string]int64{}, count: map[string]int{}}
}

// Add checks deliveries in the order they arrived. A delivery whose
// payload has no seq fails as a violation.
func (c *OrderChecker) Add(ds ...amqp.Delivery) {
	for _, d := range ds {
		if c.seen[d.MessageId] {
			c.Duplicates++
			continue
		}
		c.seen[d.MessageId] = true
		key := fmt.Sprintf("%v/%v", d.Headers["aggregate_type"], d.Headers["aggregate_id"])
		var body struct {
			Seq *int64 `json:"seq"`
		}
		if err := json.Unmarshal(d.Body, &body); err != nil || body.Seq == nil {
			c.Violations = append(c.Violations, fmt.Sprintf("%s: message %s has no seq: %q", key, d.MessageId, d.Body))
			continue
		}
		// The first arrival of seq n must come after those of 1 … n-1, so
		// first arrivals of an aggregate count up by one.
		if want := c.last[key] + 1; *body.Seq != want {
			c.Violations = append(c.Violations, fmt.Sprintf("%s: seq %d arrived first where %d was due", key, *body.Seq, want))
		}
		if *body.Seq > c.last[key] {
			c.last[key] = *body.Seq
		}
		c.count[key]++
	}
}

// Unique is how many distinct message ids arrived.
func (c *OrderChecker) Unique() int { return len(c.seen) }

// Arrived is how many distinct events of the aggregate ("type/id") arrived.
func (c *OrderChecker) Arrived(aggregate string) int { return c.count[aggregate] }
