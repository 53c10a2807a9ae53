package main

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// operationsPage is the page whose configuration table configTable renders.
const operationsPage = "../../docs/operations.md"

// TestConfigTable fails when docs/operations.md's configuration table is
// not the one the run command's flags give. With UPDATE_DOCS=1 it writes
// the table in instead.
func TestConfigTable(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(operationsPage)
	require.NoError(t, err)
	page := string(raw)
	begin, end := strings.Index(page, configBegin), strings.Index(page, configEnd)
	require.True(t, begin >= 0 && end > begin, "docs/operations.md has no %s … %s block", configBegin, configEnd)
	begin += len(configBegin)
	want := "\n\n" + configTable() + "\n"
	if os.Getenv("UPDATE_DOCS") != "" {
		require.NoError(t, os.WriteFile(operationsPage, []byte(page[:begin]+want+page[end:]), 0o644))
		t.Logf("wrote the configuration table into %s", operationsPage)
		return
	}
	require.Equal(t, want, page[begin:end],
		"docs/operations.md's configuration table differs from the flags; regenerate it with\n"+
			"\tUPDATE_DOCS=1 go test -count=1 -run TestConfigTable ./cmd/outboxrelay")
}

func TestConfigTableRendersFlags(t *testing.T) {
	t.Parallel()
	table := configTable()
	for _, row := range []string{
		"| `--database-url` | `DATABASE_URL` | `postgres://postgres@localhost:5432/postgres` | PostgreSQL connection URL;",
		"| `--[no-]migrate` | `OUTBOX_MIGRATE` | `true` | Before relaying,",
		"| `--no-listen` | `OUTBOX_NO_LISTEN` | `false` | Poll only,",
		"| `--listener-url` | `OUTBOX_LISTENER_URL` |  | PostgreSQL URL of a session of its own",
		"| `--column-id` | `OUTBOX_COLUMN_ID` | `id` | Integer column identifying a row (its ids may come from anywhere: claims follow relay_seq). |",
	} {
		require.Contains(t, table, row)
	}
	require.NotContains(t, table, "--ordered-design", "hidden flags stay out")
	require.NotContains(t, table, "--help")
	require.Contains(t, table, "\n**Column mapping (existing tables)**\n\n| flag |")
	require.Equal(t, `a \| b`, tableCell("a |\n  b"))
}
