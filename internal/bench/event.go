package bench

import (
	"strconv"
	"strings"
)

// Every event the benchmark writes is numbered, and its number travels in
// its event id: event n has the id 00000000-0000-4000-8000-<n as 12 hex
// digits>, a valid version 4 UUID. Numbers are unique over a whole run.
const eventIDPrefix = "00000000-0000-4000-8000-"

// eventIDSQL is eventID in SQL, for a bigint column n.
const eventIDSQL = `('` + eventIDPrefix + `' || lpad(to_hex(n), 12, '0'))::uuid`

// Every event has aggregate type "bench" and event type "created", so its
// routing key is "bench.created"; its aggregate id is its number, or, in
// the ordered workload, the number of its aggregate (see Shape).
const (
	aggregateType = "bench"
	eventType     = "created"
	routingKey    = aggregateType + "." + eventType
)

// eventID is the event id of event n.
func eventID(n int64) string {
	h := strconv.FormatInt(n, 16)
	return eventIDPrefix + strings.Repeat("0", 12-len(h)) + h
}

// parseEventID returns the number of a benchmark event id.
func parseEventID(id string) (int64, bool) {
	if len(id) != len(eventIDPrefix)+12 || !strings.HasPrefix(id, eventIDPrefix) {
		return 0, false
	}
	n, err := strconv.ParseInt(id[len(eventIDPrefix):], 16, 64)
	if err != nil {
		return 0, false
	}
	return n, true
}

// payloads builds event bodies of about a given size: the JSON object
// {"n": <n>, "pad": "xxx…"}, written exactly as PostgreSQL prints the jsonb
// (keys by length, ", " and ": " separators), so an event published by the
// ceiling has the bytes the relay would read from the table.
type payloads struct{ pad string }

// payloadOverhead is the size of {"n": , "pad": ""} plus a few digits of n.
const payloadOverhead = 24

func newPayloads(size int) payloads {
	return payloads{pad: strings.Repeat("x", max(0, size-payloadOverhead))}
}

// of returns event n's payload.
func (p payloads) of(n int64) string {
	return `{"n": ` + strconv.FormatInt(n, 10) + `, "pad": "` + p.pad + `"}`
}

// withSeq returns the payload of event n written as its aggregate's event
// seq (ordered workloads): {"n": <n>, "pad": "xxx…", "seq": <seq>}.
func (p payloads) withSeq(n, seq int64) string {
	return `{"n": ` + strconv.FormatInt(n, 10) + `, "pad": "` + p.pad + `", "seq": ` + strconv.FormatInt(seq, 10) + `}`
}

// padLen is the pad's length, for the SQL that builds payloads in bulk.
func (p payloads) padLen() int { return len(p.pad) }
