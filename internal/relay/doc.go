// Package relay is the dispatcher: it wires the notify listener, the claim
// store and the RabbitMQ publisher into the loop wake → claim → publish →
// mark, with a jittered fallback poll and a cleanup loop beside it.
//
// Wake-ups coalesce: poll ticks, retry timers and the start feed one
// buffered signal, and notifications the listener's own, so any burst
// becomes one claim pass. A claim sees the events of every notification
// received before it was sent, so a notification the listener counted
// (Listener.Signals) before a claim went out claims nothing more, even when
// it reached another idle worker: notifications read together wake one
// claim. A pass keeps claiming until a batch comes back short; a full batch
// wakes another worker, so a backlog is drained by every worker at once.
//
// With a Config.Gate, the relay steers the trigger's notifications by the
// insert rate (the growth of the id sequence, with Config.Inserts, or of
// the ids it claims): above Config.BusyRate it closes the gate, so
// producers stop paying for NOTIFY, and claims every BusyPollInterval;
// below half of it, it opens the gate, waits out the producers that saw it
// closed, and claims once more, so no wake-up is lost. With Inserts, an
// open gate reads the sequence every IdleInsertsEvery (2 s) while nothing
// is claimed, and claims when it moved past the ids claimed: an insert
// whose notification never came (a lost notification, a disabled trigger)
// waits that long, not the fallback poll.
//
// A batch holds its rows by a lease, which the relay renews from half-way
// through for as long as the batch is in flight (a broker that blocks the
// connection, a slow link, a mark retried), so a live relay's rows never
// pass to another claim; a lapsed lease can cost a duplicate, never an
// event. With a Config.Recovery, the rows of a relay that died are rescued
// after each advance of the floor, and after a claim that failed without
// the server's answer the workers wait while the database does not answer,
// and the rows that claim may have leased are given back once it does.
// Memory is bounded by what is in flight: Config.Workers batches, each at
// most BatchSize events and the claim store's byte budget.
//
// A batch from an ordered claim (its events carry an OrderingKey) holds a
// run of consecutive events for each of its aggregates, and goes out in
// waves: the first event of every run, then the second, and so on, each
// wave one pipelined publish whose confirmations are all awaited before the
// next. So an event is sent only after its predecessor was confirmed, and
// at most one event per aggregate is unconfirmed at any moment; aggregates
// share every round trip. A failed event holds back the rest of its run,
// which is released; the failed event, backing off or dead-lettered, then
// blocks its aggregate in the table (see package claim), unless the store
// says its dead-lettering lets the aggregate go on, in which case it is
// recorded before the next event of the aggregate is sent.
//
// A row is marked published only after RabbitMQ confirmed it and did not
// return it. The mark waits for the next claim, up to Config.MarkDelay, and
// goes in the same round trip and commit (claim.Store.MarkAndClaim); one
// loop makes the marks no claim carried in time. Failed rows go back on the
// claim store's retry schedule, or are dead-lettered when they can never
// succeed.
//
// On shutdown the relay stops claiming and gives what is in flight
// Config.ShutdownTimeout to be published, confirmed and marked, or put back
// for retry. It then releases whatever those batches did not publish, for
// at most ReleaseGrace more, so Run returns within ShutdownTimeout +
// ReleaseGrace of the start of shutdown. A step that has not finished by
// its deadline leaves its events leased until their lease expires: they
// are claimed again then, a confirmed one perhaps published twice, none
// lost.
//
// A Config.Observer (package metrics has one) is told what the relay does:
// each claim with its duration and size, each batch's published events
// with their lag and the batch's publish time, the events retried and
// dead-lettered by reason (publish.Reason, which the "publish failed" log
// lines carry too), those released, and the gate's state. Relay.Live
// tells a liveness probe whether the loops run.
package relay
