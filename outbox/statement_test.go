package outbox

import (
	"strings"
	"testing"
)

// The named constants are what the builder makes of the relay's own
// table, so the zero Writer and Writer{Table: "outbox"} write alike.
func TestDefaultStatementIsTheBuiltOne(t *testing.T) {
	t.Parallel()
	for binary, want := range map[bool]string{false: defaultStatement, true: binaryStatement} {
		built, err := Writer{Table: "outbox", Columns: Columns{Payload: "payload"}}.buildStatement(binary)
		if err != nil {
			t.Fatal(err)
		}
		if built != want {
			t.Fatalf("built:\n%s\nwant:\n%s", built, want)
		}
	}
}

func TestStatementQuotesIdentifiers(t *testing.T) {
	t.Parallel()
	s, err := Writer{Table: `my "app".events`, Columns: Columns{AggregateType: `entity"; DROP TABLE x; --`}}.statement(false)
	if err != nil {
		t.Fatal(err)
	}
	want := `INSERT INTO "my ""app"""."events" ("event_id", "entity""; DROP TABLE x; --", "aggregate_id", "event_type", "payload", "headers", "exchange", "routing_key", "available_at")`
	if !strings.Contains(s, want) {
		t.Fatalf("statement:\n%s\nwant it to contain:\n%s", s, want)
	}
	again, err := Writer{Table: `my "app".events`, Columns: Columns{AggregateType: `entity"; DROP TABLE x; --`}}.statement(false)
	if err != nil {
		t.Fatal(err)
	}
	if again != s {
		t.Fatalf("the same Writer again:\n%s\nthe first time:\n%s", again, s)
	}
}

func TestArrayLiteral(t *testing.T) {
	t.Parallel()
	var a arrayBuilder
	if got := a.String(); got != "{}" {
		t.Fatalf("empty: %s, want {}", got)
	}
	a.add(`a"b\c`, true)
	a.add("", false)
	a.add("NULL", true)
	if got, want := a.String(), `{"a\"b\\c",NULL,"NULL"}`; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}
