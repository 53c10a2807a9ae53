// Package claim is the outbox store: it claims batches of pending events with
// FOR UPDATE SKIP LOCKED, marks them published, puts failed ones back on an
// exponential, jittered retry schedule, dead-letters those that ran out of
// attempts, releases leases on shutdown and deletes old published rows.
//
// A claim is one short statement that leases the rows it returns: it moves
// their available_at to the lease deadline and stamps them with a lease id.
// No transaction stays open while RabbitMQ is waited on. A lease that expires
// makes the rows claimable again by anyone; a late mark from the relay that
// lost its lease is still correct, because a confirmed publish is a
// delivered event.
//
// Rows need not wait for the lease when no relay will settle them. With
// Config.Instance, a claim's lease names the relay instance that made it,
// which holds an advisory lock while it lives; Rescue makes the rows of an
// instance whose lock is gone claimable at once. A claim that failed after
// it may have reached the server remembers its lease, and ReleaseLost gives
// its rows back once the database answers (rescue.go).
//
// Extend renews a lease still held, for a batch that is slow to settle.
// MarkAndClaim marks one batch and claims the next in one round trip and
// one transaction.
//
// A claim takes at most its limit of rows and, counting their payloads and
// headers, at most Config.MaxBatchBytes (but always one row): a backlog of
// large events never comes into memory at once.
//
// Several relays, and several workers inside one, claim disjoint rows.
//
// With Config.Ordering OrderAggregate, claims keep each aggregate's order
// (the aggregate is named by Config.OrderingKey). An aggregate's head is
// its first pending row by id (or failed row, under DeadLetterBlock), and
// an aggregate is claimable only while its head is due: a head that is
// leased, backing off or dead-lettered blocks its aggregate through the
// rows alone, with no lock held and no state beside the table, so a relay
// that dies holding a head blocks the aggregate only until its claim is
// rescued or its lease expires. A claim takes a run of consecutive due rows from each of many
// claimable aggregates, found by a round-robin walk over the ordering
// index (see ordered.sql), and returns each event's OrderingKey, so the
// caller can publish each run in order. Unblocks tells the caller whether
// a failure lets the rest of its run go.
//
// The table, its column names and its status values come from Config, so an
// existing outbox table (see the sql folder) can be used as it is. Identifiers
// are quoted with pgx.Identifier; statements are rendered once, at New.
//
// Every statement runs under Config.Settings. On a direct connection they
// are the pool's startup parameters (ConfigurePool) and pgx prepares the
// statements. With Config.Pooled, for a transaction-mode pooler such as
// PgBouncer, nothing is kept per session: LocalSettings sends the settings
// with each statement, in the same round trip and transaction.
//
// Compatibility: Store, Config and the exported types and errors they use
// are the package's promise; until v1.0.0 a change that breaks them is
// named in CHANGELOG.md, from v1.0.0 only a major version makes one. The
// statements the store runs, and the indexes they rely on, are not a
// promise: any release may change them, bringing a migration (and the
// drop-in SQL) where the schema must follow.
package claim
