// Package sql holds the drop-in SQL for existing outbox tables, embedded so
// the binary can print it (outboxrelay sql): the install and uninstall
// scripts and the least-privilege role. They are psql scripts: they read
// psql variables (-v name=value, or \set before them) and set only the
// defaults of those not given.
package sql

import _ "embed"

// Install is sql/outboxrelay_install.sql: the columns, indexes, NOTIFY
// trigger and wake-up gate the relay needs, added to an existing table.
//
//go:embed outboxrelay_install.sql
var Install string

// Uninstall is sql/outboxrelay_uninstall.sql, which undoes Install.
//
//go:embed outboxrelay_uninstall.sql
var Uninstall string

// Role is sql/outboxrelay_role.sql, the least-privilege role the relay can
// run as.
//
//go:embed outboxrelay_role.sql
var Role string
