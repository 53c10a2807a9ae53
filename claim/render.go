package claim

import (
	_ "embed"
	"fmt"
	"strings"
	"text/template"

	"github.com/outboxrelay/outboxrelay/internal/sqltmpl"
	tablewriters "github.com/outboxrelay/outboxrelay/internal/writers"
)

//go:embed queries.sql
var queriesSQL string

//go:embed ordered.sql
var orderedSQL string

//go:embed rescue.sql
var rescueSQL string

// queries are the store's statements, rendered for its table and columns.
type queries struct {
	// table is the table's name, quoted: in statements, and as regclass
	// text for the catalog queries.
	table                                                                string
	claim, markPublished, retry, extend, release, deletePublished, check string
	checkOrdering, sample                                                string
	insertSequence, checkSeq, lastInsertID, notifyWaiters                string
	advance, parked, sweep                                               string
	// The statements of rescue.go.
	rescueHeld, rescueInstances, releaseLeases, probe string
}

// render fills the templates of queries.sql and ordered.sql with cfg's
// table, columns and status literals.
func render(cfg Config) (queries, error) {
	table, _ := splitTable(cfg.Table)
	data := map[string]string{
		"Table":     sqltmpl.Identifier(table...),
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
		data[col[0]] = sqltmpl.Identifier(col[1])
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
	// inserting lists the transactions that have drawn from the seq
	// column's sequence, $1, and not yet ended: the table's inserts.
	funcs["inserting"] = func() string { return tablewriters.Drawing }
	// lease is the lease column, of a table alias or none.
	lease := func(alias string) string {
		if alias == "" {
			return data["LeaseID"]
		}
		return alias + "." + data["LeaseID"]
	}
	// stamped tests that a row's lease carries a relay instance (a
	// version 8 UUID, rescue.go), holder reads that instance as pg_locks
	// shows it, and liveInstances lists the instances whose lock (class
	// $N, given) a session of this database holds, as an array named ids.
	funcs["stamped"] = func(alias string) string { return "substr(" + lease(alias) + "::text, 15, 1) = '8'" }
	funcs["holder"] = func(alias string) string {
		return "('x' || left(" + lease(alias) + "::text, 8))::bit(32)::bigint"
	}
	funcs["liveInstances"] = func(class string) string {
		return "SELECT ARRAY (SELECT l.objid::bigint FROM pg_locks AS l WHERE l.locktype = 'advisory' AND l.classid = " + class +
			"::int4::oid AND l.objsubid = 2 AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())) AS ids"
	}
	funcs["size"] = func(alias string) string {
		return fmt.Sprintf("pg_column_size(%[1]s.%[2]s) + coalesce(pg_column_size(%[1]s.%[3]s), 0) + coalesce(pg_column_size(%[1]s.%[4]s), 0)",
			alias, data["Payload"], data["PayloadBytes"], data["Headers"])
	}
	named, err := sqltmpl.Render(funcs, data, queriesSQL, orderedSQL, rescueSQL)
	if err != nil {
		return queries{}, fmt.Errorf("claim: %w", err)
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
		checkSeq:        named["check_seq"],
		lastInsertID:    named["last_insert_id"],
		notifyWaiters:   named["notify_waiters"],
		advance:         named["advance"],
		parked:          named["parked"],
		sweep:           named["sweep"],
		rescueHeld:      named["rescue_held"],
		rescueInstances: named["rescue_instances"],
		releaseLeases:   named["release_leases"],
		probe:           named["probe"],
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
			return list(func(_ int, c string) string { return alias + "." + sqltmpl.Identifier(c) })
		},
		"keyAs": func(alias string) string {
			return list(func(i int, c string) string {
				return fmt.Sprintf("%s.%s AS k%d", alias, sqltmpl.Identifier(c), i)
			})
		},
		"keyOf": func(alias string) string {
			return list(func(i int, _ string) string { return fmt.Sprintf("%s.k%d", alias, i) })
		},
	}
}

// literal quotes a status value (validated by statusValue) as a SQL string
// literal.
var literal = sqltmpl.Literal
