package bench

import (
	"fmt"
	"strconv"
	"strings"
)

// Shape is an ordered backlog: Aggregates aggregates with Events events
// each, written "<aggregates>x<events>" (e.g. "1000x50").
//
// Event slot i of a shaped record belongs to aggregate i mod Aggregates,
// whose sequence number (seq, from 1) it is number i / Aggregates + 1: the
// slots are interleaved by aggregate (event 1 of every aggregate, then event
// 2, …), the order producers that each write a little to many aggregates
// would write them in, and the order of the rows' ids.
type Shape struct {
	Aggregates int
	Events     int
}

// String is the shape as a flag writes it.
func (s Shape) String() string { return strconv.Itoa(s.Aggregates) + "x" + strconv.Itoa(s.Events) }

// UnmarshalText parses "<aggregates>x<events>".
func (s *Shape) UnmarshalText(text []byte) error {
	a, e, ok := strings.Cut(strings.TrimSpace(string(text)), "x")
	if !ok {
		return fmt.Errorf("shape %q: want <aggregates>x<events per aggregate>, e.g. 1000x50", text)
	}
	var err error
	if s.Aggregates, err = strconv.Atoi(a); err != nil {
		return fmt.Errorf("shape %q: aggregates: %w", text, err)
	}
	if s.Events, err = strconv.Atoi(e); err != nil {
		return fmt.Errorf("shape %q: events per aggregate: %w", text, err)
	}
	return nil
}

// total is how many events the shape has.
func (s Shape) total() int { return s.Aggregates * s.Events }

// slotOf is the slot of aggregate a's event seq in a record of the given
// number of aggregates.
func slotOf(aggregates int, a, seq int64) int64 { return (seq-1)*int64(aggregates) + a }
