// Package publish sends outbox events to RabbitMQ and reports, message by
// message, which ones the broker has taken responsibility for.
//
// A Publisher owns one AMQP connection and a small pool of confirm-mode
// channels. Publish sends a whole batch on one channel, then awaits every
// publisher confirmation under a single deadline, renewed while messages
// are sent and confirmed; it never waits for one message before sending
// the next. Messages are sent persistent and
// mandatory, so a message no queue is bound for comes back as a
// basic.return and fails with ErrReturned rather than vanishing: an ack
// alone does not prove a message was routed.
//
// A message fails on its own, the rest of its batch unaffected, when it is
// invalid (ErrInvalid), its exchange does not exist (ErrExchangeNotFound,
// checked before sending, because a publish to a missing exchange closes
// the channel under the whole batch), it was returned (ErrReturned) or
// nacked (ErrNacked). Losing the channel or the connection, or running
// out of time, fails every unconfirmed message of the batch; such errors
// are transient. Reason names a failure's class in a few stable words,
// the ones the relay's metrics, logs and PRODUCER spans share.
//
// Dial connects once and fails fast. Run keeps the connection up: it
// reconnects with jittered exponential backoff and re-declares the
// exchange. WaitReady blocks while the publisher is disconnected or the
// broker has blocked the connection (a memory or disk alarm); Publish does
// not wait, it fails at once with ErrNotConnected. A batch already in
// flight when the broker blocks the connection waits for the alarm to
// clear rather than time out: its messages may already be in the broker's
// hands, and failing them would only publish them twice.
//
// amqp091-go has no automatic reconnection of its own here (its
// experimental recovery is left off): a lost connection takes its channels
// with it, and with them any confirmation still outstanding, which is why a
// channel is only reused after every confirmation of its batch is in.
//
// Compatibility: Publisher, Config, Message and the exported errors are the
// package's promise; until v1.0.0 a change that breaks them is named in
// CHANGELOG.md, from v1.0.0 only a major version makes one. What a consumer
// receives (the AMQP properties and headers a message carries) is a
// promise too, documented in docs/producers.md. How messages are spread
// over channels, and the timing of confirmations, are not.
package publish
