package main_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// Events whose ids are handed out before their insert: a sequence with
// CACHE above 1, an id taken with nextval() and used seconds later, an id
// the application chooses. Each commits below ids the relay has already
// published; the relay must deliver it all the same, from the migrations'
// table and from a drop-in one, in unordered and ordered mode, with the
// fallback poll an hour away and the sweep ten minutes away, so that only
// the claims' own floor can find it.

// earlyIDTable is an outbox table whose id sequence the test controls.
type earlyIDTable struct {
	pool   *pgxpool.Pool
	url    string
	table  string // quoted
	idSeq  string // the id column's sequence, quoted
	flags  []string
	insert string // $1 aggregate id, $2 payload: inserts one event, the id from its column's default
	withID string // $1 id, $2 aggregate id, $3 payload: inserts one event with that id
}

// appOutboxSchema is a team's own outbox table whose ids come from a
// sequence of its own, as an ORM would have it (Hibernate's pooled
// optimizer allocates 50 at a time).
const appOutboxSchema = `CREATE SEQUENCE app_outbox_id_seq;
CREATE TABLE app_outbox (
	id             bigint PRIMARY KEY DEFAULT nextval('app_outbox_id_seq'),
	aggregate_type text NOT NULL,
	aggregate_id   text NOT NULL,
	event_type     text NOT NULL,
	payload        jsonb NOT NULL,
	status         text NOT NULL DEFAULT 'pending',
	created_at     timestamptz NOT NULL DEFAULT now()
);
ALTER SEQUENCE app_outbox_id_seq OWNED BY app_outbox.id`

// newEarlyIDTable makes the migrations' outbox (dropIn false) or a drop-in
// table, in ordered mode's shape if ordering is "aggregate".
func newEarlyIDTable(t *testing.T, dropIn bool, ordering string) earlyIDTable {
	t.Helper()
	if !dropIn {
		url, pool := testkit.NewOutbox(t)
		return earlyIDTable{pool: pool, url: url, table: "outbox", idSeq: "outbox_id_seq",
			flags:  []string{"--ordering=" + ordering},
			insert: `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'created', $2)`,
			withID: `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, 'order', $2, 'created', $3)`}
	}
	url := testkit.NewDatabase(t)
	pool := testkit.NewPool(t, url)
	testkit.Exec(t, pool, appOutboxSchema)
	psql(t, url, "-v", "table=app_outbox", "-v", "id_column=id", "-v", "ordering="+ordering, "-f", "../../sql/outboxrelay_install.sql")
	return earlyIDTable{pool: pool, url: url, table: "app_outbox", idSeq: "app_outbox_id_seq",
		flags:  []string{"--no-migrate", "--table=public.app_outbox", "--column-id=id", "--ordering=" + ordering},
		insert: `INSERT INTO app_outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'created', $2)`,
		withID: `INSERT INTO app_outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, 'order', $2, 'created', $3)`}
}

// forEachEarlyIDTable runs f on the migrations' table and a drop-in one,
// in each ordering, each in parallel with a relay of its own that polls
// once an hour. f gets the table, its queue and the relay's counter.
func forEachEarlyIDTable(t *testing.T, f func(t *testing.T, tb earlyIDTable, queue *testkit.Queue, seen testkit.Counter)) {
	for _, dropIn := range []bool{false, true} {
		for _, ordering := range []string{"none", "aggregate"} {
			name := fmt.Sprintf("migrations table, ordering %s", ordering)
			if dropIn {
				name = fmt.Sprintf("drop-in table, ordering %s", ordering)
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				tb := newEarlyIDTable(t, dropIn, ordering)
				exchange := testkit.NewExchange(t)
				queue := testkit.NewQueue(t, exchange, "#")
				p := startRelay(t, relayEnv(tb.url, exchange, "OUTBOX_POLL_INTERVAL=1h"), tb.flags...)
				seen := testkit.Counter{}
				f(t, tb, queue, seen)
				p.Stop(30 * time.Second)
			})
		}
	}
}

// awaitEvent waits for the event with the given id among the deliveries,
// counting every delivery it reads.
func awaitEvent(t *testing.T, tb earlyIDTable, queue *testkit.Queue, seen testkit.Counter, id int64, timeout time.Duration) {
	t.Helper()
	var eventID string
	require.NoError(t, tb.pool.QueryRow(context.Background(),
		fmt.Sprintf(`SELECT event_id::text FROM %s WHERE id = $1`, tb.table), id).Scan(&eventID))
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for seen[eventID] == 0 {
		select {
		case d := <-queue.Deliveries:
			seen[d.MessageId]++
		case <-deadline.C:
			t.Fatalf("event %d (%s) not delivered within %s; %d events seen", id, eventID, timeout, len(seen))
		}
	}
}

// insertFlow inserts n events, one transaction each, and waits for them.
func insertFlow(t *testing.T, tb earlyIDTable, queue *testkit.Queue, seen testkit.Counter, n int) {
	t.Helper()
	want := len(seen) + n
	for i := range n {
		testkit.Exec(t, tb.pool, tb.insert, fmt.Sprintf("flow-%d", i%13), `{}`)
	}
	collect(t, queue, seen, want, 60*time.Second)
}

// Eight sessions insert round by round from an id sequence with CACHE 50:
// each session holds a block of 50 ids, so every round commits ids below
// those the earlier rounds of the other sessions took and the relay
// published. Every event arrives.
func TestEventsFromACachedIDSequenceAreAllDelivered(t *testing.T) {
	t.Parallel()
	forEachEarlyIDTable(t, func(t *testing.T, tb earlyIDTable, queue *testkit.Queue, seen testkit.Counter) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		testkit.Exec(t, tb.pool, `ALTER SEQUENCE `+tb.idSeq+` CACHE 50`)
		const sessions, rounds = 8, 25
		conns := make([]*pgx.Conn, sessions)
		for i := range conns {
			c, err := pgx.Connect(ctx, tb.url)
			require.NoError(t, err)
			defer c.Close(context.Background())
			conns[i] = c
		}
		for r := range rounds {
			for i, c := range conns {
				_, err := c.Exec(ctx, tb.insert, fmt.Sprintf("s%d", i), fmt.Sprintf(`{"round": %d}`, r))
				require.NoError(t, err)
			}
			// Each round goes out before the next commits below it.
			collect(t, queue, seen, (r+1)*sessions, 30*time.Second)
		}
		require.Len(t, seen, sessions*rounds)
		var spread int64
		require.NoError(t, tb.pool.QueryRow(ctx, `SELECT max(id) - min(id) FROM `+tb.table).Scan(&spread))
		require.Greater(t, spread, int64(sessions*rounds), "the sessions took their ids from blocks of 50")
	})
}

// A session takes an id with nextval(), and inserts its event with it
// seconds later, after hundreds of later events were published: the
// event arrives.
func TestEventInsertedSecondsAfterItsNextvalIsDelivered(t *testing.T) {
	t.Parallel()
	forEachEarlyIDTable(t, func(t *testing.T, tb earlyIDTable, queue *testkit.Queue, seen testkit.Counter) {
		var id int64
		require.NoError(t, tb.pool.QueryRow(context.Background(), `SELECT nextval('`+tb.idSeq+`')`).Scan(&id))
		insertFlow(t, tb, queue, seen, 300)
		testkit.Exec(t, tb.pool, tb.withID, id, "early", `{}`)
		awaitEvent(t, tb, queue, seen, id, 20*time.Second)
	})
}

// An application chooses its event's id itself, below every id the relay
// has published: the event arrives.
func TestEventWithAnExplicitIDBelowTheFloorIsDelivered(t *testing.T) {
	t.Parallel()
	forEachEarlyIDTable(t, func(t *testing.T, tb earlyIDTable, queue *testkit.Queue, seen testkit.Counter) {
		insertFlow(t, tb, queue, seen, 300)
		testkit.Exec(t, tb.pool, tb.withID, 0, "chosen", `{}`)
		awaitEvent(t, tb, queue, seen, 0, 20*time.Second)
	})
}

// The relay refuses to start (exit 2) where relay_seq cannot keep its
// floor: its sequence hands out values in blocks, or inserts do not draw
// from it. The message says what to run.
func TestRelayRefusesARelaySeqThatCannotOrderItsClaims(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, alter, want string
		dropIn            bool
	}{
		{"cached sequence", `ALTER TABLE outbox ALTER COLUMN relay_seq SET CACHE 50`, "has CACHE 50", false},
		{"cached sequence of a drop-in table", `ALTER SEQUENCE app_outbox_relay_seq CACHE 20`, "ALTER SEQUENCE public.app_outbox_relay_seq CACHE 1", true},
		{"no default", `ALTER TABLE app_outbox ALTER COLUMN relay_seq DROP DEFAULT`, "SET DEFAULT nextval('public.app_outbox_relay_seq')", true},
		{"a default of another sequence", `CREATE SEQUENCE other_seq; ALTER TABLE app_outbox ALTER COLUMN relay_seq SET DEFAULT nextval('other_seq')`,
			"does not default to nextval of its sequence", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tb := newEarlyIDTable(t, tc.dropIn, "none")
			testkit.Exec(t, tb.pool, tc.alter)
			args := append([]string{"run", "--no-migrate"}, tb.flags[:len(tb.flags)-1]...)
			code, _, stderr := runOnce(t, relayEnv(tb.url, testkit.NewExchange(t)), args...)
			require.Equal(t, 2, code, stderr)
			require.Contains(t, stderr, "the seq column cannot order the claims")
			require.Contains(t, stderr, tc.want)
		})
	}
}
