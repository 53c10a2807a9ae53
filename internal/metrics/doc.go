// Package metrics exports what the relay does and what its outbox holds as
// Prometheus metrics.
//
// Metrics implements relay.Observer: the relay's workers count the events
// they publish, retry, dead-letter and release, and time their claims and
// publishes. State gauges (connections, the broker's block, readiness) are
// set by whoever watches that state (package health). Sampler reads the
// table's gauges (rows by status, the oldest pending event's age, blocked
// aggregates) and what holds back vacuum's horizon for the table (the
// oldest snapshot or transaction of a session, a prepared transaction, a
// standby's feedback or a replication slot, by age) on an interval, on one
// relay at a time: the one holding a PostgreSQL advisory lock. The others
// export none of these gauges, so dashboards and alerts aggregate them with
// max().
//
// Every name is fixed and documented in docs/operations.md (Metrics).
package metrics
