package outbox

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The named constant is what the builder makes of the relay's own table, so
// the zero Writer and Writer{Table: "outbox"} write alike.
func TestDefaultStatementIsTheBuiltOne(t *testing.T) {
	t.Parallel()
	built, err := Writer{Table: "outbox", Columns: Columns{Payload: "payload"}}.buildStatement()
	require.NoError(t, err)
	require.Equal(t, defaultStatement, built)
}

func TestStatementQuotesIdentifiers(t *testing.T) {
	t.Parallel()
	s, err := Writer{Table: `my "app".events`, Columns: Columns{AggregateType: `entity"; DROP TABLE x; --`}}.statement()
	require.NoError(t, err)
	require.Contains(t, s, `INSERT INTO "my ""app"""."events" ("entity""; DROP TABLE x; --", "aggregate_id", "event_type", "payload", "headers", "exchange", "routing_key")`)
	again, err := Writer{Table: `my "app".events`, Columns: Columns{AggregateType: `entity"; DROP TABLE x; --`}}.statement()
	require.NoError(t, err)
	require.Equal(t, s, again)
}

func TestArrayLiteral(t *testing.T) {
	t.Parallel()
	var a arrayBuilder
	require.Equal(t, "{}", a.String())
	a.add(`a"b\c`, true)
	a.add("", false)
	a.add("NULL", true)
	require.Equal(t, `{"a\"b\\c",NULL,"NULL"}`, a.String())
}
