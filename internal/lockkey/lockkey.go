// Package lockkey holds the PostgreSQL advisory lock keys outboxrelay
// takes, each defined here once: Go code takes its locks with these
// constants. The SQL of the migrations and of the drop-in install script
// cannot import them and spells the same numbers out;
// migrations.TestSQLTakesTheLocksLockkeyDefines holds every lock call and
// every key those files mention to these, and fails when one side changes
// alone. A released migration is never edited: should a key change, the
// old one stays here under a name of its own, as GateV2 did.
//
// A two-key lock (class, key) and a one-key lock (a bigint) never
// conflict, even with equal numbers: PostgreSQL keeps them apart.
package lockkey

// Two-key locks: the class here, the second key hashtext of a name (but
// for Relay's).
const (
	// GateV2 is the gate lock of triggers installed by migration 2, which
	// read the gate sequence under it; (GateV2, hashtext(channel)). No
	// relay takes it any more.
	GateV2 = 1868722808
	// Gate is the notification gate: a busy relay holds (Gate,
	// hashtext(channel)) exclusive and the trigger tries it shared.
	Gate = 1868722809
	// Sampler is the table sampler's turn: (Sampler, hashtext(table)),
	// held by one relay of a table at a time.
	Sampler = 1868722810
	// Listen is the listen lock: a listening relay holds (Listen,
	// hashtext(channel)) exclusive and the trigger tries it shared,
	// notifying only when that fails.
	Listen = 1868722811
	// Relay is a relay's instance lock: a running relay holds (Relay,
	// its instance id) exclusive on its listening connection while that
	// connection lives, and stamps the id on its claims' leases; another
	// relay that finds the lock gone in pg_locks takes those claims'
	// rows over. The second key is a random number, not a hash.
	Relay = 1868722812
)

// One-key locks.
const (
	// Setup serializes the schema installation (outboxrelay migrate, a
	// relay's start-up, the install script) and its concurrent index
	// builds.
	Setup = 1868722809
)
