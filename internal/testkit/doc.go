// Package testkit holds the helpers the test suites share: a fresh
// PostgreSQL database per test, a fresh RabbitMQ exchange and queue per test,
// a fault-injecting TCP proxy (toxiproxy, in process), and waits with a
// deadline instead of sleeps.
//
// Everything talks to the real services: PostgreSQL at TEST_DATABASE_URL
// (default postgres://postgres@127.0.0.1:5432/test) and RabbitMQ at
// TEST_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/). A test that
// cannot reach them fails; it never skips.
package testkit
