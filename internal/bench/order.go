package bench

import (
	"bytes"
	"strconv"
	"sync/atomic"
)

// place is where an event belongs: its aggregate (in a message, the
// aggregate_id header, a number) and its seq within it (the payload's
// "seq"); -1 where a message does not say.
type place struct{ aggregate, seq int64 }

// placeOf reads a delivery's place from its aggregate_id header and its
// body, {"n": …, "pad": "…", "seq": <seq>} as PostgreSQL prints the jsonb.
func placeOf(aggregateID any, body []byte) place {
	l := place{aggregate: -1, seq: -1}
	if s, ok := aggregateID.(string); ok {
		if a, err := strconv.ParseInt(s, 10, 64); err == nil {
			l.aggregate = a
		}
	}
	if i := bytes.LastIndex(body, []byte(`"seq": `)); i >= 0 {
		rest := body[i+len(`"seq": `):]
		end := 0
		for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
			end++
		}
		if seq, err := strconv.ParseInt(string(rest[:end]), 10, 64); err == nil {
			l.seq = seq
		}
	}
	return l
}

// orderCheck checks what ordered mode promises a consumer: within every
// aggregate, the first arrival of each event comes after the first
// arrivals of all its predecessors. The record is shaped (see Shape): slot
// i is event i/aggregates+1 of aggregate i mod aggregates.
type orderCheck struct {
	aggregates int
	// done[a] is how many of aggregate a's first events have all arrived.
	// Only the consumer's goroutine touches it.
	done []int64
	// late counts first arrivals out of order.
	late atomic.Int64
}

// newShapedRecord is a record of aggregates interleaved aggregates that
// checks the order of first arrivals.
func newShapedRecord(base int64, size, aggregates int) *record {
	rec := newRecord(base, size)
	rec.order = &orderCheck{aggregates: aggregates, done: make([]int64, aggregates)}
	return rec
}

// aggregates is how many aggregates the record's events belong to; 0 for
// an unshaped record, whose every event is an aggregate of its own.
func (r *record) aggregates() int {
	if r.order == nil {
		return 0
	}
	return r.order.aggregates
}

// placeAt is the place slot i's event was written with (shaped records).
func (r *record) placeAt(i int) place {
	a := r.order.aggregates
	return place{aggregate: int64(i % a), seq: int64(i/a) + 1}
}

// checkOrder notes the first arrival of slot i, which said l. It is out of
// order if an earlier event of its aggregate has not arrived yet, or if
// the message names another aggregate or seq than the one written.
func (r *record) checkOrder(i int64, l place) {
	o := r.order
	want := r.placeAt(int(i))
	if l != want || o.done[want.aggregate] < want.seq-1 {
		o.late.Add(1)
	}
	a := want.aggregate
	for {
		next := slotOf(o.aggregates, a, o.done[a]+1)
		if next >= int64(len(r.received)) || atomic.LoadInt64(&r.received[next]) == 0 {
			return
		}
		o.done[a]++
	}
}

// outOfOrder is how many first arrivals came out of order; nil for a
// record that does not check.
func (r *record) outOfOrder() *int64 {
	if r.order == nil {
		return nil
	}
	return ptr(r.order.late.Load())
}
