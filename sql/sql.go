// Package sql holds the drop-in SQL for existing outbox tables, embedded so
// the binary can print it (outboxrelay sql) and run it (outboxrelay
// migrate --table): the install and uninstall scripts and the
// least-privilege role. They are psql scripts: they read psql variables
// (-v name=value, or \set before them) and set only the defaults of those
// not given.
//
// What it promises to importers: the scripts' text and their variables
// (Settings). The scripts change with the relay; run the version that
// matches the relay you deploy.
package sql

import (
	_ "embed"
	"strings"
)

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

// Settings are Install's variables. An empty field takes the script's
// default, which its header lists (table has none: it is required).
type Settings struct {
	Table, Schema, Channel, GateSequence                   string
	IDColumn, EventIDColumn, StatusColumn, CreatedAtColumn string
	StatusPending, StatusPublished, StatusFailed           string
	Ordering, OrderingKey                                  string
}

// Vars lists the variables that are set, by their names in the script, in
// the script's order.
func (s Settings) Vars() [][2]string {
	all := [][2]string{
		{"table", s.Table},
		{"schema", s.Schema},
		{"channel", s.Channel},
		{"gate_sequence", s.GateSequence},
		{"id_column", s.IDColumn},
		{"event_id_column", s.EventIDColumn},
		{"status_column", s.StatusColumn},
		{"created_at_column", s.CreatedAtColumn},
		{"status_pending", s.StatusPending},
		{"status_published", s.StatusPublished},
		{"status_failed", s.StatusFailed},
		{"ordering", s.Ordering},
		{"ordering_key", s.OrderingKey},
	}
	set := all[:0]
	for _, v := range all {
		if v[1] != "" {
			set = append(set, v)
		}
	}
	return set
}

// InstallStatement is the statement of Install that does the work: a DO
// block that reads each variable from the transaction's setting
// outboxrelay.<name> (the script sets them from the psql variables). A
// program runs it in a transaction after setting every variable, which it
// must: the block has no defaults of its own.
func InstallStatement() string { return installStatement }

// installStatement is cut from Install once: from its DO to the end of the
// block's closing dollar quote.
var installStatement = func() string {
	const start, end = "DO $install$", "$install$;"
	i := strings.Index(Install, start)
	j := strings.LastIndex(Install, end)
	if i < 0 || j < i {
		panic("sql: outboxrelay_install.sql has no DO $install$ block")
	}
	return Install[i : j+len(end)]
}()
