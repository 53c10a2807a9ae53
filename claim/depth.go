package claim

import "sync"

// Ordered claims choose how many aggregates to take at once. A claim pays
// one index descent per aggregate its key walk visits, and the relay one
// publish round trip per event of the longest run it took. When aggregates
// hold one event each, a batch must span BatchSize aggregates to be full.
// When they are deep, a batch of a few aggregates with longer runs costs
// the database far less per event: the walk visits a quarter of the
// aggregates and each run is read in one index range scan.
const (
	// deepRunFactor divides the batch size into the heads of a claim on
	// deep aggregates: runs of up to this many events.
	deepRunFactor = 4
	// depthMemory is how many recent claims the gauge remembers the
	// aggregates of.
	depthMemory = 4
)

// depthGauge tells from recent claims whether aggregates are deep. While
// a claim takes as many heads as the batch holds, each run is its head
// alone and says nothing of depth; then aggregates count as deep when most
// of a claim's aggregates were taken by one of the few claims before it
// too (they had more events). Once claims take fewer heads, runs show the
// depth: aggregates stay deep while runs average two events or more.
type depthGauge struct {
	mu     sync.Mutex
	deep   bool
	claims uint64
	seen   map[string]uint64 // aggregate key → the last claim that took it
}

// heads is how many heads the next claim of up to limit events takes.
func (g *depthGauge) heads(limit int) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.deep {
		return max(limit/deepRunFactor, 1)
	}
	return limit
}

// observe learns from a claim of up to limit events that took one event
// per key of keys (in any order).
func (g *depthGauge) observe(limit int, keys []string) {
	if len(keys) == 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.seen == nil {
		g.seen = map[string]uint64{}
	}
	g.claims++
	heads, again := 0, 0
	for _, k := range keys {
		last, ok := g.seen[k]
		if ok && last == g.claims {
			continue // a later event of a run already counted
		}
		heads++
		if ok && g.claims-last <= depthMemory {
			again++
		}
		g.seen[k] = g.claims
	}
	if heads < limit {
		// Runs could be longer than their head: their length tells.
		g.deep = len(keys) >= 2*heads
	} else {
		g.deep = again*2 >= heads
	}
	if len(g.seen) > 8*len(keys)+1024 {
		for k, last := range g.seen {
			if g.claims-last > depthMemory {
				delete(g.seen, k)
			}
		}
	}
}
