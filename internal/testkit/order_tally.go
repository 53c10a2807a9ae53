package testkit

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// OrderTally is an OrderChecker that any goroutine may feed and await,
// which also counts deliveries by aggregate type (the scenario's classes).
type OrderTally struct {
	mu         sync.Mutex
	check      *OrderChecker
	deliveries map[string]int
	changed    chan struct{} // closed, and replaced, on every Add
}

// NewOrderTally returns an empty tally.
func NewOrderTally() *OrderTally {
	return &OrderTally{check: NewOrderChecker(), deliveries: map[string]int{}, changed: make(chan struct{})}
}

// Add checks deliveries in the order they arrived.
func (o *OrderTally) Add(ds ...amqp.Delivery) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, d := range ds {
		o.deliveries[fmt.Sprint(d.Headers["aggregate_type"])]++
	}
	o.check.Add(ds...)
	close(o.changed)
	o.changed = make(chan struct{})
}

// Unique is how many distinct message ids arrived.
func (o *OrderTally) Unique() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.check.Unique()
}

// Violations are the first arrivals so far that came before one of their
// predecessors' (OrderChecker.Violations).
func (o *OrderTally) Violations() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.check.Violations)
}

// Await waits until at least n distinct message ids arrived, and reports
// whether they did within timeout.
func (o *OrderTally) Await(n int, timeout time.Duration) bool {
	return o.await(n, timeout, nil) == nil
}

var (
	errTimeout = errors.New("timed out")
	errQuit    = errors.New("quit")
)

// await is Await that also gives up when quit is closed.
func (o *OrderTally) await(n int, timeout time.Duration, quit <-chan struct{}) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		o.mu.Lock()
		got, changed := o.check.Unique(), o.changed
		o.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-changed:
		case <-quit:
			return errQuit
		case <-deadline.C:
			return errTimeout
		}
	}
}
