package relay_test

import (
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/internal/relay"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// A relay killed mid-batch leaves its rows leased. When the lease lapses
// within a second of the floor of the relay that stays first meeting it,
// before the floor parks the rows, nothing announces the lapse: no insert,
// no notification, and the fallback poll is an hour away. The relay, which
// has claimed everything else, is woken for them all the same and
// delivers them.
func TestLeaseLapsingBeforeTheFloorParksItIsDelivered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start(t, options{relay: relay.Config{PollInterval: time.Hour}, floor: true})
	seen := testkit.Counter{}
	testkit.InsertEvents(t, e.pool, 1)
	e.collect(t, seen, 1, 30*time.Second) // the relay is up

	// 100 rows as a killed relay leaves them, leased for 300 ms more, and
	// one event after them, in one transaction: its notification brings
	// the claim that takes it, the last id, and nothing else comes.
	testkit.Exec(t, e.pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, lease_id, available_at, attempts)
		SELECT 'order', i::text, 'created', '{}',
			CASE WHEN i <= 100 THEN l.id END,
			CASE WHEN i <= 100 THEN now() + interval '300 milliseconds' ELSE now() END,
			CASE WHEN i <= 100 THEN 1 ELSE 0 END
		FROM generate_series(1, 101) AS i, (SELECT gen_random_uuid() AS id) AS l`)
	e.collect(t, seen, 102, 20*time.Second)
	testkit.WaitFor(t, 20*time.Second, "every event marked published", func() bool {
		return e.count(t, "status = 'pending'") == 0
	})
}
