package bench

import (
	"math"
	"slices"
	"sync/atomic"
	"time"
)

// clock reads the benchmark's one monotonic clock: nanoseconds since the
// run began, never 0 (0 means "not yet" in a record). Producers and the
// consumer run in the same process, so their readings compare directly.
type clock struct{ base time.Time }

func newClock() clock { return clock{base: time.Now()} }

func (c clock) now() int64 { return int64(time.Since(c.base)) + 1 }

// at is t as a reading of the clock.
func (c clock) at(t time.Time) int64 { return int64(t.Sub(c.base)) + 1 }

// record is the ledger of one run of one system: for the events numbered
// base … base+len-1, when each one's INSERT committed and when the consumer
// first received it, as clock readings (0: not yet). Slots are written with
// atomic operations by producers and the consumer at once.
type record struct {
	base      int64
	committed []int64
	received  []int64
	distinct  atomic.Int64
	dups      atomic.Int64
	// order, if set, checks the order of first arrivals per aggregate.
	order *orderCheck
	// progress receives a coalesced signal after each new event.
	progress chan struct{}
}

func newRecord(base int64, size int) *record {
	return &record{
		base:      base,
		committed: make([]int64, size),
		received:  make([]int64, size),
		progress:  make(chan struct{}, 1),
	}
}

// size is how many events the record has room for.
func (r *record) size() int { return len(r.committed) }

// number is the event number of slot i.
func (r *record) number(i int) int64 { return r.base + int64(i) }

// commit notes that slot i's INSERT committed at t.
func (r *record) commit(i int, t int64) { atomic.StoreInt64(&r.committed[i], t) }

// commitAll notes that every slot committed at t.
func (r *record) commitAll(t int64) {
	for i := range r.committed {
		atomic.StoreInt64(&r.committed[i], t)
	}
}

// receive notes the delivery of event n at t, which the message places at l
// (read only for a record that checks order); an event outside the record
// is ignored. A second delivery of an event counts as a duplicate. Only
// the consumer's goroutine calls it.
func (r *record) receive(n, t int64, l place) {
	i := n - r.base
	if i < 0 || i >= int64(len(r.received)) {
		return
	}
	if !atomic.CompareAndSwapInt64(&r.received[i], 0, t) {
		r.dups.Add(1)
		return
	}
	if r.order != nil {
		r.checkOrder(i, l) // before the count, so a full count sees every check
	}
	r.distinct.Add(1)
	select {
	case r.progress <- struct{}{}:
	default:
	}
}

// count is how many distinct events have arrived.
func (r *record) count() int64 { return r.distinct.Load() }

// duplicates is how many deliveries repeated an event already received.
func (r *record) duplicates() int64 { return r.dups.Load() }

// span is a stretch of the clock, from (included) to (excluded).
type span struct{ from, to int64 }

// always is every clock reading.
var always = span{1, math.MaxInt64}

// holds reports whether the clock reading t, not 0 ("not yet"), is within
// s.
func (s span) holds(t int64) bool { return t != 0 && t >= s.from && t < s.to }

// lost is how many events committed but have not arrived.
func (r *record) lost() int64 { return r.lostIn(always) }

// lostIn is how many events that committed within s have not arrived.
func (r *record) lostIn(s span) int64 {
	var n int64
	for i := range r.committed {
		if s.holds(atomic.LoadInt64(&r.committed[i])) && atomic.LoadInt64(&r.received[i]) == 0 {
			n++
		}
	}
	return n
}

// committedIn is how many events committed within s.
func (r *record) committedIn(s span) int64 {
	var n int64
	for i := range r.committed {
		if s.holds(atomic.LoadInt64(&r.committed[i])) {
			n++
		}
	}
	return n
}

// receivedIn is how many events first arrived within s.
func (r *record) receivedIn(s span) int64 {
	var n int64
	for i := range r.received {
		if s.holds(atomic.LoadInt64(&r.received[i])) {
			n++
		}
	}
	return n
}

// lastReceived is the clock reading of the latest first delivery, 0 if none.
func (r *record) lastReceived() int64 {
	var last int64
	for i := range r.received {
		last = max(last, atomic.LoadInt64(&r.received[i]))
	}
	return last
}

// latency summarizes commit → first delivery over the events that arrived.
// A delivery the clock saw before its producer noted the commit (the relay
// can be that quick) counts as 0. Nil if none arrived.
func (r *record) latency() *Latency { return r.latencyIn(always) }

// latencyIn is latency over the events that committed within s.
func (r *record) latencyIn(s span) *Latency {
	var ds []int64
	for i := range r.received {
		c, rc := atomic.LoadInt64(&r.committed[i]), atomic.LoadInt64(&r.received[i])
		if !s.holds(c) || rc == 0 {
			continue
		}
		ds = append(ds, max(0, rc-c))
	}
	if len(ds) == 0 {
		return nil
	}
	slices.Sort(ds)
	return &Latency{
		P50:  millis(percentile(ds, 50)),
		P90:  millis(percentile(ds, 90)),
		P99:  millis(percentile(ds, 99)),
		P999: millis(permille(ds, 999)),
		Max:  millis(ds[len(ds)-1]),
	}
}

// early is how many events arrived before their committed reading (for a
// scheduled event, its due time).
func (r *record) early() int64 {
	var n int64
	for i := range r.received {
		if rc := atomic.LoadInt64(&r.received[i]); rc != 0 && rc < atomic.LoadInt64(&r.committed[i]) {
			n++
		}
	}
	return n
}

// percentile is the nearest-rank percentile p of sorted, non-empty xs.
func percentile(xs []int64, p int) int64 {
	rank := (p*len(xs) + 99) / 100 // ceil(p/100 · n)
	return xs[max(rank, 1)-1]
}

// permille is the nearest-rank per-mille p of sorted, non-empty xs.
func permille(xs []int64, p int) int64 {
	rank := (p*len(xs) + 999) / 1000 // ceil(p/1000 · n)
	return xs[max(rank, 1)-1]
}

func millis(ns int64) float64 { return float64(ns) / 1e6 }
