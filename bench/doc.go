// Package bench measures outboxrelay against a naive poller and against the
// broker's own ceiling, on a real PostgreSQL and a real RabbitMQ.
//
// Run drives six workloads, each selectable through Config.Only:
//
//   - drain: a backlog of Config.DrainEvents pending rows, written in one
//     statement while no relay runs, is delivered from the relay's start to
//     the last event at the consumer. The naive poller gets
//     Config.NaiveDrainTime; the ceiling publishes the same number of
//     pre-built messages straight to the exchange with pipelined confirms.
//   - steady: open-loop producers insert one event per transaction at each
//     of Config.SteadyRates; latency is commit → consumer.
//   - idle: one producer writes one event every Config.IdleInterval.
//   - producer: how fast Config.ProducerConcurrency connections can insert
//     with the outbox's insert triggers enabled and disabled, and, with the
//     triggers enabled, with the ordered relay running and the ordering
//     index it creates.
//   - ordered: each of Config.OrderedShapes (aggregates × events, written
//     interleaved by aggregate, each event's seq in its payload) drained by
//     the relay and by the ordered relay with each claim design (keyscan,
//     distinct; distinct within Config.OrderedDistinctTime), then a steady
//     Config.OrderedSteadyRate spread over Config.OrderedSteadyAggregates
//     on the same three. The consumer counts first arrivals out of order
//     per aggregate on all of them.
//   - scale: the drain's backlog delivered by each of Config.ScaleRelays
//     relays side by side on the one table, started together; their cost
//     is summed.
//
// Unordered systems always run without the ordering index (it is dropped
// before them), so their figures do not pay for it; ordered relays run
// with the index they create as they migrate.
//
// The relay under test is the real one: the current binary re-executed as
// "outboxrelay run", with its own application_name so that its PostgreSQL
// backends can be found and their CPU time read from /proc. The naive
// poller (RunNaive) runs the same way as "outboxrelay naive-relay". The
// consumer lives in the benchmark process, on the same clock as the
// producers: event n carries the event id
// 00000000-0000-4000-8000-<n as 12 hex digits>, so a delivery is matched to
// its commit without a map.
//
// CPU figures come from /proc and are only available on Linux with
// PostgreSQL on the same machine; elsewhere they are left out.
package bench
