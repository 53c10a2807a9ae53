// Package sqltmpl renders files of named SQL statement templates, as
// package claim's store and the admin commands keep theirs: each statement
// starts at a line "-- name: <name>" and runs to the next such line, and
// whatever a file holds before its first name is commentary. A statement
// is a text/template filled with identifiers from the configuration (a
// table, a column), quoted by Identifier, and with the few fixed values
// that must be literals for a partial index to match (status values),
// quoted by Literal. Everything else a statement needs goes as a
// parameter.
package sqltmpl
