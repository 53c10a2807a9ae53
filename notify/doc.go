// Package notify is the relay's wake-up source: it LISTENs for the outbox
// trigger's NOTIFY and turns notifications into a coalescing wake signal.
//
// A notification is a hint, never data. The outbox table is the only source
// of truth, so a notification that is lost, dropped or coalesced costs
// latency, never an event. The Listener therefore wakes the dispatcher:
//
//   - once when Run starts, before and independent of connecting, so the
//     dispatcher does a first pass;
//   - after every successful (re)connect, as soon as LISTEN has succeeded,
//     so rows inserted while the listener was disconnected are claimed;
//   - on every notification on Config.Channel.
//
// Wake-ups coalesce: C is buffered with room for one and every send is
// non-blocking, so any burst of notifications that arrives while the
// dispatcher is busy becomes a single wake-up. Signals counts every
// wake-up, folded or not, so a receiver can tell one that a look at the
// table begun after it already covers.
//
// The Listener owns one dedicated connection (never one borrowed from a
// pool: a pooled connection would be reused, reset or closed under it) and
// drives it with github.com/jackc/pgxlisten. It covers pgxlisten's weak
// spots:
//
//   - Reconnects use exponential, jittered backoff (ReconnectMin to
//     ReconnectMax, never giving up) instead of pgxlisten's fixed delay; the
//     first attempt is immediate and the backoff resets once LISTEN succeeds.
//   - A silently dead idle connection is noticed by a heartbeat: every
//     PingInterval the Listener sends a notification on its own private
//     channel through Config.Pinger (another connection, typically the
//     relay's pool) and expects it back on the listening connection within
//     PingTimeout; if it does not come back, the connection is dropped and
//     re-established. TCP keepalive on the listener's socket is a second,
//     slower line of defence.
//
// With Config.Instance, the listening connection also holds an instance
// lock under an id drawn for it (Listener.Instance): the relay stamps the
// id on its claims, and other relays take those claims over once the lock
// is gone with the connection's session.
//
// Everything stops when Run's context is cancelled.
//
// Gate silences the trigger while the relay is busy claiming anyway:
// PostgreSQL serializes the commits of transactions that sent NOTIFY, so a
// notification per insert caps busy producers. Close holds an exclusive
// advisory lock, in a transaction the server ends after a TTL without
// refresh, and the trigger, trying that lock shared in its WHEN clause and
// failing, is skipped, NOTIFY with it; Open ends the transaction and then
// waits, through pg_locks, for every transaction that held the outbox's
// ROW EXCLUSIVE lock at that moment, so the claim that follows sees the
// events of every producer that may have found the gate closed. The
// trigger only tries the lock: producers never wait for a relay.
//
// Compatibility: Listener, Gate, their Config and the exported constants
// are the package's promise; until v1.0.0 a change that breaks them is
// named in CHANGELOG.md, from v1.0.0 only a major version makes one. The
// notification's payload and the gate's advisory-lock keys are shared
// with the trigger that the migrations and the drop-in SQL install: they
// change only together with a migration, never on their own.
package notify
