// Package inbox is the consumer side of outboxrelay: it runs an
// application's handler once per message, inside a PostgreSQL transaction
// that records the message, and acks the delivery only after that
// transaction commits. A service that consumes the relay's messages and
// keeps its state in PostgreSQL gets its effects applied exactly once,
// though RabbitMQ delivers at least once.
//
//	consumer, err := inbox.New(inbox.Config{
//		AMQPURL: "amqp://guest:guest@localhost:5672/",
//		Queue:   "shipping.orders", // with a dead-letter exchange
//		Name:    "shipping",
//		DB:      pool, // *pgxpool.Pool
//		Handler: func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
//			_, err := tx.Exec(ctx, `INSERT INTO shipments ...`)
//			return err
//		},
//	})
//	...
//	err = consumer.Run(ctx) // until ctx is cancelled
//
// # What happens to a delivery
//
// For each delivery the consumer begins a transaction on a connection of
// Config.DB and, in the same round trip, runs one statement, an INSERT ...
// ON CONFLICT DO UPDATE of the row (consumer, message id) that marks it
// processed unless it was; then the handler with that transaction; then
// COMMIT; then the ack. When the row was processed
// already, the delivery is a duplicate: the transaction is rolled back and
// the delivery acked without running the handler. The insert's row lock is
// held until the transaction ends, so a copy of the message delivered
// concurrently (to another consumer, or within the prefetch) waits on it
// and then, re-reading the committed row, finds it processed: the handler
// runs once. This needs the default isolation level, READ COMMITTED, on the
// connections of Config.DB.
//
// A delivery is acked only when the commit returned nil, or when it is a
// duplicate. When the commit fails without the server saying so (a lost
// connection, a timeout), it may have happened: the delivery is not acked,
// and the next attempt (in process, or a redelivery) finds out.
//
// # The handler's transaction
//
// The handler's pgx.Tx is the inbox's own: pgx's Begin would send BEGIN in
// a round trip of its own. It works as pgx's does, savepoints (tx.Begin)
// included, except LargeObjects, which panics with ErrLargeObjects (the
// server's lo_* functions work through Exec and QueryRow). Once the handler
// returned, it refuses every call with pgx.ErrTxClosed.
//
// # Ids
//
// The message's key is its AMQP message-id property, which the relay sets to
// the event's id; Config.IDHeader picks a header instead, for messages from
// elsewhere. A delivery without one is rejected (without requeue) to the
// queue's dead-letter exchange and counted, never processed: it could not be
// told from its duplicates.
//
// # Failures
//
// A handler that returns an error or panics has its transaction rolled back
// (its writes and the message's record with it), and the failed attempt is
// counted in the message's row, in a statement of its own, so attempts
// survive restarts and are shared by the consumer's copies. The delivery is
// then retried in process after a jittered backoff (Config.RetryMin,
// doubling, up to Config.RetryMax); after Config.MaxAttempts failed
// attempts it is rejected to the dead-letter exchange (and its attempts
// reset, for when it is moved back). A failure that is the database's, not
// the handler's (a begin or a commit that fails, a connection terminated)
// is retried the same way without being counted.
//
// # Chaining
//
// A handler that writes new events with the producer library,
// github.com/outboxrelay/outboxrelay/outbox, in its transaction, chains
// services: the events exist exactly when the message's effects do, and
// the relay publishes them after the commit. See the example.
//
// # Retention
//
// A message's row is kept for Config.Retention (7 days by default), then
// deleted by the cleanup in bounded batches. A duplicate delivered after the
// window is processed again.
//
// # Schema
//
// Migrate creates the table; inbox.sql in the module is the same DDL as a
// drop-in file. The consumer needs SELECT, INSERT and UPDATE on it, and
// DELETE for the cleanup; the README lists the GRANTs.
//
// # Shutdown
//
// When Run's context is cancelled, the consumer stops taking deliveries,
// lets the handlers in flight finish for up to Config.ShutdownTimeout, then
// cancels their context; their transactions roll back and their deliveries
// go back to the queue, unacked. Run returns nil.
//
// # Compatibility
//
// The package is a Go module of its own, apart from the relay's, and imports
// nothing of the relay. It needs Go 1.23 or later and requires at least
// pgx v5.7.6, amqp091-go v1.16.0, client_golang v1.23.2 and
// cenkalti/backoff v4.3.0; these are minimums.
package inbox
