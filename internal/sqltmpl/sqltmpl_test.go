package sqltmpl_test

import (
	"strings"
	"testing"
	"text/template"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/sqltmpl"
)

const queries = `-- Commentary before the first name is no statement.

-- name: count
SELECT count(*) FROM {{.Table}} WHERE {{.Status}} = {{lit "it's"}};

-- name: cols  
SELECT {{cols "o"}}
FROM {{.Table}} AS o;
`

func TestRenderFillsEachNamedStatement(t *testing.T) {
	t.Parallel()
	funcs := template.FuncMap{
		"lit":  sqltmpl.Literal,
		"cols": func(alias string) string { return alias + "." + sqltmpl.Identifier("a b") },
	}
	data := map[string]string{"Table": sqltmpl.Identifier("app", `out"box`), "Status": sqltmpl.Identifier("status")}
	got, err := sqltmpl.Render(funcs, data, queries, "-- name: more\nSELECT 1;")
	require.NoError(t, err)
	require.Equal(t, map[string]string{
		"count": `SELECT count(*) FROM "app"."out""box" WHERE "status" = 'it''s';`,
		"cols":  "SELECT o.\"a b\"\nFROM \"app\".\"out\"\"box\" AS o;",
		"more":  "SELECT 1;",
	}, got)
}

func TestRenderRefusesWhatItCannotFill(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, file, want string
	}{
		{"a missing datum", "-- name: q\nSELECT {{.Nope}}", "render q"},
		{"a broken template", "-- name: q\nSELECT {{.Table", "parse q"},
		{"a name given twice", "-- name: q\nSELECT 1;\n-- name: q\nSELECT 2;", "q named twice"},
	} {
		_, err := sqltmpl.Render(nil, map[string]string{"Table": "t"}, tc.file)
		require.ErrorContains(t, err, tc.want, tc.name)
	}
}

func TestLiteralAndIdentifierQuote(t *testing.T) {
	t.Parallel()
	require.Equal(t, `'pending'`, sqltmpl.Literal("pending"))
	require.Equal(t, `'a''b\c'`, sqltmpl.Literal(`a'b\c`))
	require.Equal(t, `"outbox"`, sqltmpl.Identifier("outbox"))
	require.Equal(t, `"we.ird"."t""x"`, sqltmpl.Identifier("we.ird", `t"x`))
	require.False(t, strings.Contains(sqltmpl.Identifier("a\x00b"), "\x00"), "pgx drops NUL bytes")
}
