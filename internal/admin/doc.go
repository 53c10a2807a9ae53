// Package admin inspects and repairs the outbox: how many events are
// pending, published and dead-lettered and how old the oldest pending one is
// (Status), which events are dead-lettered and why (Dead), putting
// dead-lettered events back to pending and waking the relays at once
// (Requeue), and inserting test events for smoke tests and demos (Emit).
//
// It works on the table a claim.Config describes: the relay's own outbox or
// an existing table set up with the drop-in SQL, whatever its column names
// and status values. Statements live in queries.sql; identifiers from the
// configuration are quoted with pgx.Identifier and every value, status
// values included, is a parameter.
//
// Status and Dead only read, so they work under the relay's least-privilege
// role (sql/outboxrelay_role.sql); Requeue updates rows, which that role may
// do too; Emit inserts, as a producer does, which that role may not.
package admin
