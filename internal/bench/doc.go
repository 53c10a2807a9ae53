// Package bench measures outboxrelay against a naive poller and against the
// broker's own ceiling, on a real PostgreSQL and a real RabbitMQ.
//
// Run drives eight workloads, each selectable through Config.Only (all but
// horizon by default):
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
//     the relay and by the ordered relay, then a steady
//     Config.OrderedSteadyRate spread over Config.OrderedSteadyAggregates
//     on both. The consumer counts first arrivals out of order per
//     aggregate on both.
//   - scale: the drain's backlog delivered by each of Config.ScaleRelays
//     relays side by side on the one table, started together; their cost
//     is summed.
//   - scheduled: Config.ScheduledEvents events written in one statement to
//     a relay polling every hour, due one after another over
//     Config.ScheduledOver; latency is due time → consumer, and arrivals
//     before their time are counted.
//   - early-ids: four sessions write Config.EarlyIDsRate events per second
//     for Config.EarlyIDsDuration while the id sequence hands out ids in
//     blocks of 50 (CACHE 50), so each session commits ids below those
//     the relay already published; latency is commit → consumer, and an
//     event that has not arrived within Config.DrainWait is lost.
//   - bursts: Config.BurstPairs times, a burst with the outbox's triggers
//     enabled, then one with them disabled, each after the relay rested
//     for Config.BurstRest: Config.BurstProducers connections insert as
//     fast as they can for Config.BurstDuration, one event per
//     transaction. Each burst is a row: the commit rate over the burst and
//     over its first second, where the gate has yet to see the load;
//     with the triggers, latency commit → consumer; the relay's CPU over
//     the burst and its drain. The ratios compare the rates with and
//     without the triggers.
//   - steps: after the relay rested a second, Config.Producers
//     connections write, open loop, at each of Config.StepRates for
//     Config.StepDuration, without a break. Each step is a row: the rate
//     achieved, latency commit → consumer of the events committed in it,
//     and the relay's CPU during it per event committed in it.
//   - horizon: Config.Producers connections write Config.HorizonRate
//     events per second over Config.HorizonAggregates aggregates without
//     a break, measured in windows of Config.HorizonWindow:
//     Config.HorizonBefore baseline windows, then Config.HorizonPinned
//     (rounded up to whole windows) while a REPEATABLE READ transaction
//     on a connection of its own, which counted the outbox once, sits idle
//     in transaction and pins the horizon, then Config.HorizonAfter
//     windows after it commits. Each window is a row: first arrivals per
//     second; the lag of the events committed in it; the CPU of the relay
//     and of every client backend of the database but the benchmark's own
//     (the producers' included) per 1,000 arrivals; the claim time's mean
//     and the bound of its p99's bucket from the relay's histogram; then,
//     read after the window's cost, the pending rows (count(*)) and the
//     table's n_dead_tup. A ratio compares the last pinned window with the
//     mean of the before windows. It takes about 14 minutes with its
//     defaults, hence runs only when named.
//
// Unordered systems always run without the ordering index (it is dropped
// before them), so their figures do not pay for it; ordered relays run
// with the index they create as they migrate.
//
// The relay under test is the real one: the outboxrelay binary
// Config.RelayBinary names, run as "outboxrelay run", with its own
// application_name so that its PostgreSQL backends can be found and their
// CPU time read from /proc. The naive poller (RunNaive) runs the same way
// as "outboxrelay-bench naive-relay" (Config.NaiveBinary). The
// consumer lives in the benchmark process, on the same clock as the
// producers: event n carries the event id
// 00000000-0000-4000-8000-<n as 12 hex digits>, so a delivery is matched to
// its commit without a map.
//
// CPU figures come from /proc and are only available on Linux with
// PostgreSQL on the same machine; elsewhere they are left out.
package bench
