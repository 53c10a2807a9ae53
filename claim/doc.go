// Package claim is the outbox store: it claims batches of pending events with
// FOR UPDATE SKIP LOCKED, marks them published, puts failed ones back on an
// exponential, jittered retry schedule, dead-letters those that ran out of
// attempts, releases leases on shutdown and deletes old published rows.
//
// A claim is one short statement that leases the rows it returns: it moves
// their available_at to the lease deadline and stamps them with a lease id.
// No transaction stays open while RabbitMQ is waited on. A lease that expires
// (its relay died) makes the rows claimable again by anyone, so nothing needs
// to rescue them; a late mark from the relay that lost its lease is still
// correct, because a confirmed publish is a delivered event.
//
// Extend renews a lease still held, for a batch that is slow to settle.
//
// A claim takes at most its limit of rows and, counting their payloads and
// headers, at most Config.MaxBatchBytes (but always one row): a backlog of
// large events never comes into memory at once.
//
// Several relays, and several workers inside one, claim disjoint rows.
//
// The table, its column names and its status values come from Config, so an
// existing outbox table (see the sql folder) can be used as it is. Identifiers
// are quoted with pgx.Identifier; statements are rendered once, at New.
package claim
