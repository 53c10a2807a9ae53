// Package redact keeps passwords out of logs and error texts.
//
// Connection URLs carry their passwords (DATABASE_URL, AMQP_URL,
// OUTBOX_LISTENER_URL), and the libraries that reject or fail to reach
// them may quote them in their errors. [URL] gives the form of a URL that
// may be logged, and [Error] the form of an error that may be logged or
// returned. Both accept a comma-separated list of URLs as well as one, so
// a setting that names several brokers is redacted element by element.
//
// The binary, the benchmark and the test helpers all use this one
// implementation; it depends on the standard library only, so any of
// them (and notify, claim or publish) may import it without importing
// one another.
package redact
