package claim

import (
	_ "embed"
	"fmt"
	"slices"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"
)

//go:embed queries.sql
var queriesSQL string

//go:embed ordered.sql
var orderedSQL string

// queries are the store's statements, rendered for its table and columns.
type queries struct {
	// table is the table's name, quoted: in statements, and as regclass
	// text for the catalog queries.
	table                                                                string
	claim, markPublished, retry, extend, release, deletePublished, check string
	checkOrdering, sample                                                string
	insertSequence, lastInsertID, notifyWaiters                          string
	advance, parked, sweep                                               string
}

// render fills the templates of queries.sql and ordered.sql with cfg's
// table, columns and status literals.
func render(cfg Config) (queries, error) {
	table, _ := splitTable(cfg.Table)
	data := map[string]string{
		"Table":     pgx.Identifier(table).Sanitize(),
		"Pending":   literal(cfg.Statuses.Pending),
		"Published": literal(cfg.Statuses.Published),
		"Failed":    literal(cfg.Statuses.Failed),
		// BlockFailed (non-empty: true) says a dead letter holds its
		// aggregate back.
		"BlockFailed": "",
	}
	if cfg.OrderedDeadLetter == DeadLetterBlock {
		data["BlockFailed"] = "true"
	}
	for _, col := range cfg.Columns.named() {
		data[col[0]] = pgx.Identifier{col[1]}.Sanitize()
	}
	funcs := keyFuncs(cfg.OrderingKey)
	// keyText is a row's aggregate as text in ordered mode (as the ordered
	// claim returns it), NULL otherwise.
	funcs["keyText"] = func(alias string) string {
		if cfg.Ordering != OrderAggregate {
			return "NULL::text"
		}
		return "ROW(" + funcs["key"].(func(string) string)(alias) + ")::text"
	}
	funcs["size"] = func(alias string) string {
		return fmt.Sprintf("pg_column_size(%[1]s.%[2]s) + coalesce(pg_column_size(%[1]s.%[3]s), 0)",
			alias, data["Payload"], data["Headers"])
	}
	named := map[string]string{}
	// Each file's preamble, before its first name, is commentary.
	parts := slices.Concat(strings.Split(queriesSQL, "-- name: ")[1:], strings.Split(orderedSQL, "-- name: ")[1:])
	for _, part := range parts {
		name, body, _ := strings.Cut(part, "\n")
		tmpl, err := template.New(name).Funcs(funcs).Option("missingkey=error").Parse(body)
		if err != nil {
			return queries{}, fmt.Errorf("claim: parse %s: %w", name, err)
		}
		var b strings.Builder
		if err := tmpl.Execute(&b, data); err != nil {
			return queries{}, fmt.Errorf("claim: render %s: %w", name, err)
		}
		named[strings.TrimSpace(name)] = strings.TrimSpace(b.String())
	}
	q := queries{
		table:           data["Table"],
		claim:           named["claim"],
		markPublished:   named["mark_published"],
		retry:           named["retry"],
		extend:          named["extend"],
		release:         named["release"],
		deletePublished: named["delete_published"],
		check:           named["check"],
		checkOrdering:   named["check_ordering"],
		sample:          named["sample"],
		insertSequence:  named["insert_sequence"],
		lastInsertID:    named["last_insert_id"],
		notifyWaiters:   named["notify_waiters"],
		advance:         named["advance"],
		parked:          named["parked"],
		sweep:           named["sweep"],
	}
	if cfg.Ordering == OrderAggregate {
		q.claim = named["claim_ordered"]
	}
	if cfg.DeleteConfirmed {
		q.markPublished = named["delete_confirmed"]
	}
	return q, nil
}

// keyFuncs are the template functions that spell the ordering key: key
// lists its quoted columns of a table alias, keyAs the same named k0, k1,
// …, and keyOf those names of an alias.
func keyFuncs(cols []string) template.FuncMap {
	list := func(f func(i int, col string) string) string {
		parts := make([]string, len(cols))
		for i, c := range cols {
			parts[i] = f(i, c)
		}
		return strings.Join(parts, ", ")
	}
	return template.FuncMap{
		"key": func(alias string) string {
			return list(func(_ int, c string) string { return alias + "." + pgx.Identifier{c}.Sanitize() })
		},
		"keyAs": func(alias string) string {
			return list(func(i int, c string) string {
				return fmt.Sprintf("%s.%s AS k%d", alias, pgx.Identifier{c}.Sanitize(), i)
			})
		},
		"keyOf": func(alias string) string {
			return list(func(i int, _ string) string { return fmt.Sprintf("%s.k%d", alias, i) })
		},
	}
}

// literal quotes a status value validated by statusValue (no quotes, no
// backslashes) as a SQL string literal.
func literal(s string) string { return "'" + s + "'" }
