// Package cli holds what the repository's commands (outboxrelay and
// outboxrelay-bench) share on their command lines: how kong is set up and
// its errors reported, the exit codes, usage errors, and the log flags
// with the logger they build (tint on a terminal, JSON otherwise).
//
// It is internal: nothing here is a promise to importers.
package cli
