// Package redact keeps passwords out of logs and error texts.
//
// Connection strings carry their passwords (DATABASE_URL, AMQP_URL,
// OUTBOX_LISTENER_URL), in any of the places PostgreSQL's libpq and pgx
// read one from: the user information of a URL (user:pass@host), its
// password and sslpassword query parameters, and the password and
// sslpassword keywords of a keyword/value DSN ("host=db password=…").
// The libraries that reject or fail to reach them may quote them in their
// errors. [URL] gives the form of a connection string that may be logged,
// its passwords masked and the rest as written, and [Error] the form of
// an error that may be logged or returned. Both accept a comma-separated
// list of URLs as well as one, so a setting that names several brokers is
// redacted element by element.
//
// The binary, the benchmark and the test helpers all use this one
// implementation; it depends on the standard library only, so any of
// them (and notify, claim or publish) may import it without importing
// one another.
package redact
