package sqltmpl

import (
	"fmt"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"
)

// nameMarker starts a statement: the rest of its line is the name.
const nameMarker = "-- name: "

// Render parses the statements of files and executes each with funcs and
// data, under missingkey=error: a statement that names a datum data lacks
// fails. It returns the statements by name, each trimmed of the blanks
// around it. A name given twice, across all the files, is an error.
func Render(funcs template.FuncMap, data any, files ...string) (map[string]string, error) {
	out := map[string]string{}
	for _, file := range files {
		for _, part := range strings.Split(file, nameMarker)[1:] {
			name, body, _ := strings.Cut(part, "\n")
			name = strings.TrimSpace(name)
			if _, ok := out[name]; ok {
				return nil, fmt.Errorf("statement %s named twice", name)
			}
			tmpl, err := template.New(name).Funcs(funcs).Option("missingkey=error").Parse(body)
			if err != nil {
				return nil, fmt.Errorf("parse %s: %w", name, err)
			}
			var b strings.Builder
			if err := tmpl.Execute(&b, data); err != nil {
				return nil, fmt.Errorf("render %s: %w", name, err)
			}
			out[name] = strings.TrimSpace(b.String())
		}
	}
	return out, nil
}

// Identifier quotes a name for SQL, a schema-qualified one given as its
// parts ("app", "outbox"): each part in double quotes, with the quotes it
// holds doubled, as pgx.Identifier's Sanitize does.
func Identifier(parts ...string) string { return pgx.Identifier(parts).Sanitize() }

// Literal quotes s as a SQL string literal, with the single quotes it
// holds doubled. Like pgx, it assumes standard_conforming_strings is on
// (PostgreSQL's default), so a backslash stands for itself.
func Literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
