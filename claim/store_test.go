package claim_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newStore(t *testing.T, cfg claim.Config) (*claim.Store, func(string, ...any) int64) {
	t.Helper()
	_, pool := testkit.NewOutbox(t)
	s, err := claim.New(pool, cfg)
	require.NoError(t, err)
	return s, func(sql string, args ...any) int64 { return testkit.QueryInt(t, pool, sql, args...) }
}

func TestClaimReturnsEventsInOrderWithTheirFields(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	s, err := claim.New(pool, claim.Config{})
	require.NoError(t, err)
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers, exchange, routing_key)
		VALUES ('order', '42', 'created', '{"total": 10}', '{"tenant": "acme"}', 'orders', 'order.special'),
		       ('order', '43', 'paid', 'null', NULL, NULL, NULL)`)

	b, err := s.Claim(context.Background(), 10)
	require.NoError(t, err)
	require.Len(t, b.Events, 2)
	first, second := b.Events[0], b.Events[1]
	require.Less(t, first.ID, second.ID)
	require.Equal(t, "order", first.AggregateType)
	require.Equal(t, "42", first.AggregateID)
	require.Equal(t, "created", first.EventType)
	require.JSONEq(t, `{"total": 10}`, string(first.Payload))
	require.JSONEq(t, `{"tenant": "acme"}`, string(first.Headers))
	require.Equal(t, "orders", first.Exchange)
	require.Equal(t, "order.special", first.RoutingKey)
	require.Len(t, first.EventID, 36)
	require.Equal(t, 1, first.Attempts)
	require.WithinDuration(t, time.Now(), first.CreatedAt, time.Minute)
	require.Equal(t, "null", string(second.Payload))
	require.Nil(t, second.Headers)
	require.Empty(t, second.Exchange)
	require.Empty(t, second.RoutingKey)

	again, err := s.Claim(context.Background(), 10)
	require.NoError(t, err)
	require.Empty(t, again.Events, "leased rows must not be claimed twice")
	require.Equal(t, int64(2), testkit.QueryInt(t, pool,
		`SELECT count(*) FROM outbox WHERE lease_id = $1 AND available_at > now()`, b.Lease))
}

func TestConcurrentClaimsAreDisjointAndComplete(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	s, err := claim.New(pool, claim.Config{})
	require.NoError(t, err)
	const n = 5000
	testkit.InsertEvents(t, pool, n)

	var mu sync.Mutex
	seen := map[int64]int{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				b, err := s.Claim(context.Background(), 37)
				if !assertNoError(t, err) || len(b.Events) == 0 {
					return
				}
				mu.Lock()
				for _, e := range b.Events {
					seen[e.ID]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Len(t, seen, n)
	for id, count := range seen {
		require.Equal(t, 1, count, "event %d claimed %d times", id, count)
	}
}

func assertNoError(t *testing.T, err error) bool {
	if err != nil {
		t.Error(err)
		return false
	}
	return true
}

func TestMarkPublished(t *testing.T) {
	t.Parallel()
	s, q := newStore(t, claim.Config{})
	q(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('a','1','e','{}'),('a','2','e','{}') RETURNING 0`)
	b, err := s.Claim(context.Background(), 10)
	require.NoError(t, err)
	n, err := s.MarkPublished(context.Background(), []int64{b.Events[0].ID})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Equal(t, int64(1), q(`SELECT count(*) FROM outbox WHERE status = 'published' AND published_at IS NOT NULL AND lease_id IS NULL AND id = $1`, b.Events[0].ID))
	require.Equal(t, int64(1), q(`SELECT count(*) FROM outbox WHERE status = 'pending'`))
	n, err = s.MarkPublished(context.Background(), []int64{b.Events[0].ID})
	require.NoError(t, err)
	require.Zero(t, n, "marking twice changes nothing")
}

func TestRetrySchedulesAndDeadLetters(t *testing.T) {
	t.Parallel()
	s, q := newStore(t, claim.Config{MaxAttempts: 3, RetryMin: time.Hour, RetryMax: 4 * time.Hour, Jitter: func() float64 { return 0.5 }})
	q(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) SELECT 'a', i::text, 'e', '{}' FROM generate_series(1, 3) i RETURNING 0`)
	b, err := s.Claim(context.Background(), 10)
	require.NoError(t, err)
	require.Len(t, b.Events, 3)
	boom := errors.New("broker said no\x00 \xff")
	res, err := s.Retry(context.Background(), b.Lease, []claim.Failure{
		{ID: b.Events[0].ID, Attempts: 1, Err: boom},
		{ID: b.Events[1].ID, Attempts: 3, Err: boom},
		{ID: b.Events[2].ID, Attempts: 1, Err: boom, Permanent: true},
	})
	require.NoError(t, err)
	require.Equal(t, 2, res.Dead)
	require.Equal(t, []time.Duration{time.Hour}, res.Due)
	// First failure: back to pending, an hour (jitter 0.5 => factor 1.0) from now.
	require.Equal(t, int64(1), q(`SELECT count(*) FROM outbox WHERE id = $1 AND status = 'pending' AND lease_id IS NULL
		AND available_at BETWEEN now() + interval '59 minutes' AND now() + interval '61 minutes'
		AND last_error = 'broker said no? ?'`, b.Events[0].ID))
	require.Equal(t, int64(2), q(`SELECT count(*) FROM outbox WHERE status = 'failed' AND id = ANY($1)`,
		[]int64{b.Events[1].ID, b.Events[2].ID}))
	none, err := s.Claim(context.Background(), 10)
	require.NoError(t, err)
	require.Empty(t, none.Events)
}

func TestRetryAndReleaseNeedTheLease(t *testing.T) {
	t.Parallel()
	s, q := newStore(t, claim.Config{})
	q(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('a','1','e','{}') RETURNING 0`)
	b, err := s.Claim(context.Background(), 10)
	require.NoError(t, err)
	var other claim.LeaseID
	_, err = s.Retry(context.Background(), other, []claim.Failure{{ID: b.Events[0].ID, Attempts: 1, Err: errors.New("x")}})
	require.NoError(t, err)
	n, err := s.Release(context.Background(), other, []int64{b.Events[0].ID})
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, int64(1), q(`SELECT count(*) FROM outbox WHERE lease_id = $1 AND last_error IS NULL`, b.Lease))

	n, err = s.Release(context.Background(), b.Lease, []int64{b.Events[0].ID})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	again, err := s.Claim(context.Background(), 10)
	require.NoError(t, err)
	require.Len(t, again.Events, 1, "a released row is claimable at once")
	require.Equal(t, 1, again.Events[0].Attempts, "a release does not count an attempt")
}

func TestExpiredLeaseIsClaimableAgain(t *testing.T) {
	t.Parallel()
	s, q := newStore(t, claim.Config{Lease: 200 * time.Millisecond})
	q(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('a','1','e','{}') RETURNING 0`)
	first, err := s.Claim(context.Background(), 10)
	require.NoError(t, err)
	require.Len(t, first.Events, 1)
	var second claim.Batch
	testkit.WaitFor(t, 10*time.Second, "lease expiry", func() bool {
		second, err = s.Claim(context.Background(), 10)
		require.NoError(t, err)
		return len(second.Events) == 1
	})
	require.NotEqual(t, first.Lease, second.Lease)
	require.Equal(t, 2, second.Events[0].Attempts)
	// The first holder's confirmed publish still counts.
	n, err := s.MarkPublished(context.Background(), []int64{first.Events[0].ID})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	// And the second holder can no longer put it back.
	_, err = s.Retry(context.Background(), second.Lease, []claim.Failure{{ID: second.Events[0].ID, Attempts: 2, Err: errors.New("x")}})
	require.NoError(t, err)
	require.Equal(t, int64(1), q(`SELECT count(*) FROM outbox WHERE status = 'published'`))
}

func TestExtendRenewsOnlyTheRowsStillHeld(t *testing.T) {
	t.Parallel()
	s, q := newStore(t, claim.Config{Lease: time.Hour, RetryMin: time.Hour, RetryMax: time.Hour})
	q(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) SELECT 'a', i::text, 'e', '{}' FROM generate_series(1, 3) i RETURNING 0`)
	b, err := s.Claim(context.Background(), 10)
	require.NoError(t, err)
	require.Len(t, b.Events, 3)
	require.Equal(t, time.Hour, b.LeaseFor)
	all := ids(b.Events)
	// Settle the first two: one published, one put back for a retry.
	_, err = s.MarkPublished(context.Background(), all[:1])
	require.NoError(t, err)
	_, err = s.Retry(context.Background(), b.Lease, []claim.Failure{{ID: all[1], Attempts: 1, Err: errors.New("x")}})
	require.NoError(t, err)
	// Age the lease as if most of it had passed.
	q(`UPDATE outbox SET available_at = now() + interval '1 second' WHERE lease_id = $1 RETURNING 0`, b.Lease)

	var other claim.LeaseID
	n, err := s.Extend(context.Background(), other, all)
	require.NoError(t, err)
	require.Zero(t, n, "another lease renews nothing")
	n, err = s.Extend(context.Background(), b.Lease, all)
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "only the row still held is renewed")
	require.Equal(t, int64(1), q(`SELECT count(*) FROM outbox
		WHERE id = $1 AND lease_id = $2 AND available_at > now() + interval '59 minutes'`, all[2], b.Lease))
	again, err := s.Claim(context.Background(), 10)
	require.NoError(t, err)
	require.Empty(t, again.Events, "a renewed lease keeps the row from other claims")
}

// A claim takes no more events than fit in MaxBatchBytes, however many
// are pending, and always at least one.
func TestClaimStaysWithinItsByteBudget(t *testing.T) {
	t.Parallel()
	// Incompressible payloads of about 100 kB: their stored size is their
	// size, and the claim's statement leaves the rest unclaimed. Highly
	// compressible ones: stored in a few kB, so the statement takes them
	// all, and Claim gives back those that overflow once received.
	incompressible := `jsonb_build_object('blob', (SELECT string_agg(md5(i::text || '.' || j::text), '') FROM generate_series(1, 3200) j))`
	compressible := `jsonb_build_object('blob', repeat('x', 100000))`
	for _, tc := range []struct {
		name, payload string
		budget, want  int
		// byStatement: the statement itself leaves the rest untouched.
		byStatement bool
	}{
		{"two fit", incompressible, 250_000, 2, true},
		{"one alone is over", incompressible, 50_000, 1, true},
		{"compressible, two fit", compressible, 250_000, 2, false},
		{"compressible, one alone is over", compressible, 50_000, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, q := newStore(t, claim.Config{MaxBatchBytes: tc.budget})
			q(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
				SELECT 'a', i::text, 'e', ` + tc.payload + ` FROM generate_series(1, 10) i RETURNING 0`)
			inserted := q(`SELECT xmin::text::bigint FROM outbox WHERE id = 10`)
			b, err := s.Claim(context.Background(), 500)
			require.NoError(t, err)
			require.Len(t, b.Events, tc.want)
			total := 0
			for i, e := range b.Events {
				require.Equal(t, int64(i+1), e.ID, "the oldest events first")
				total += len(e.Payload)
			}
			require.True(t, tc.want == 1 || total <= tc.budget, "%d bytes claimed, budget %d", total, tc.budget)
			require.Equal(t, int64(10-tc.want), q(`SELECT count(*) FROM outbox WHERE lease_id IS NULL AND attempts = 0 AND available_at <= now()`),
				"the rest is neither leased nor charged an attempt")
			if tc.byStatement {
				require.Equal(t, int64(10-tc.want), q(`SELECT count(*) FROM outbox WHERE xmin::text::bigint = $1`, inserted),
					"the claim statement updated rows beyond the budget")
			}
			next, err := s.Claim(context.Background(), 500)
			require.NoError(t, err)
			require.Len(t, next.Events, tc.want, "the rest is claimable at once")
		})
	}
}

func ids(events []claim.Event) []int64 {
	out := make([]int64, len(events))
	for i, e := range events {
		out[i] = e.ID
	}
	return out
}

func TestDeletePublishedOnlyTouchesOldPublishedRows(t *testing.T) {
	t.Parallel()
	s, q := newStore(t, claim.Config{})
	q(`INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, status, published_at, available_at)
		SELECT 'a', i::text, 'e', '{}', s.status, s.published_at, now() + s.lease
		FROM generate_series(1, 250) i,
		(VALUES ('published', now() - interval '2 hours', interval '0'),
		        ('published', now() - interval '10 minutes', interval '0'),
		        ('pending', NULL, interval '0'),
		        ('pending', NULL, interval '1 hour'),
		        ('failed', NULL, interval '0')) AS s (status, published_at, lease)
		RETURNING 0`)
	var total int64
	for {
		n, err := s.DeletePublished(context.Background(), time.Hour, 100)
		require.NoError(t, err)
		total += n
		if n < 100 {
			break
		}
	}
	require.Equal(t, int64(250), total)
	require.Zero(t, q(`SELECT count(*) FROM outbox WHERE published_at < now() - interval '1 hour'`))
	require.Equal(t, int64(250), q(`SELECT count(*) FROM outbox WHERE status = 'published'`))
	require.Equal(t, int64(500), q(`SELECT count(*) FROM outbox WHERE status = 'pending'`))
	require.Equal(t, int64(250), q(`SELECT count(*) FROM outbox WHERE status = 'failed'`))
}

// TestClaimPlanStaysOnTheIndex guards the claim's plan: with a large table of
// published rows and a backlog, after ANALYZE, it must walk the pending index
// rather than hash-join the whole table.
func TestClaimPlanStaysOnTheIndex(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, status, published_at)
		SELECT 'a', i::text, 'e', '{}', CASE WHEN i <= 150000 THEN 'published' ELSE 'pending' END,
		       CASE WHEN i <= 150000 THEN now() END
		FROM generate_series(1, 200000) i`)
	testkit.Exec(t, pool, `ANALYZE outbox`)
	s, err := claim.New(pool, claim.Config{})
	require.NoError(t, err)
	sql := claim.Statements(s)["claim"]
	tx, err := pool.Begin(context.Background())
	require.NoError(t, err)
	defer tx.Rollback(context.Background())
	plan := planOf(t, tx, "EXPLAIN (ANALYZE, BUFFERS) "+sql, 500, 30000, claim.LeaseID{}, 16<<20, 0, []int64{})
	require.Contains(t, plan, "outbox_pending_idx", plan)
	require.NotContains(t, plan, "Hash Join", plan)
	require.NotContains(t, plan, "Seq Scan", plan)
}

// The case the benchmark found: rows published one by one since the last
// vacuum leave dead entries in the pending index. A bitmap scan (what the
// planner picks here without ConfigurePool) reads all of them on every
// claim; the ordered index scan marks them dead once and then skips them.
func TestClaimSkipsDeadIndexEntriesOfPublishedRows(t *testing.T) {
	t.Parallel()
	url, setup := testkit.NewOutbox(t)
	publishedOneByOne(t, setup)

	pool, s := relayStore(t, url, claim.Config{})
	explain := func() string {
		return planOf(t, pool, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "+claim.Statements(s)["claim"], 500, 30000, claim.LeaseID{}, 16<<20, 0, []int64{})
	}
	first := explain()
	require.Contains(t, first, "Index Scan using outbox_pending_idx", first)
	require.NotContains(t, first, "Bitmap", first)
	// An entry can be marked dead only once no transaction anywhere in the
	// cluster may still see its row, and other tests' transactions come and
	// go: claim until the dead entries are skipped. A bitmap scan never
	// gets there.
	var later string
	testkit.WaitFor(t, 30*time.Second, "a claim that skips the dead index entries", func() bool {
		later = explain()
		return buffers(t, later) < buffers(t, first)/4
	})
	require.NotContains(t, later, "Bitmap", later)
}

// publishedOneByOne fills a fresh outbox, autovacuum off, with 5,000
// events published one transaction at a time, and then one pending event:
// the dead entries in the pending index that make the planner, left alone,
// pick a bitmap scan for the claim.
func publishedOneByOne(t *testing.T, setup *pgxpool.Pool) {
	t.Helper()
	testkit.Exec(t, setup, `ALTER TABLE outbox SET (autovacuum_enabled = off)`)
	testkit.InsertEvents(t, setup, 5000)
	testkit.Exec(t, setup, `DO $$
		BEGIN
			FOR i IN 1..5000 LOOP
				UPDATE outbox SET status = 'published', published_at = now() WHERE id = i;
				COMMIT;
			END LOOP;
		END $$`)
	testkit.InsertEvents(t, setup, 1)
}

// ensureOrderingIndex builds the ordering index on the aggregate columns,
// as the relay's migrations do in ordered mode.
func ensureOrderingIndex(t testing.TB, url string) {
	t.Helper()
	testkit.InstallOrdering(t, url)
}

// buffers is the top line's shared buffer count of an EXPLAIN (BUFFERS).
func buffers(t *testing.T, plan string) int {
	t.Helper()
	_, rest, ok := strings.Cut(plan, "Buffers: shared hit=")
	require.True(t, ok, plan)
	n := 0
	for _, r := range rest {
		if r < '0' || r > '9' {
			break
		}
		n = n*10 + int(r-'0')
	}
	return n
}

func TestQuotedIdentifiersCannotInjectSQL(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	weird := `odd"; DROP TABLE outbox; --`
	testkit.Exec(t, pool, `CREATE SCHEMA "we.ird"`)
	testkit.Exec(t, pool, `CREATE TABLE "we.ird"."`+strings.ReplaceAll(weird, `"`, `""`)+`" (LIKE outbox INCLUDING ALL)`)
	_, err := claim.New(pool, claim.Config{Table: `we.ird.` + weird})
	require.Error(t, err, "three dotted parts are ambiguous and refused")
	testkit.Exec(t, pool, `CREATE TABLE "`+strings.ReplaceAll(weird, `"`, `""`)+`" (LIKE outbox INCLUDING ALL)`)
	s, err := claim.New(pool, claim.Config{Table: weird})
	require.NoError(t, err)
	testkit.Exec(t, pool, `INSERT INTO "`+strings.ReplaceAll(weird, `"`, `""`)+`" (aggregate_type, aggregate_id, event_type, payload) VALUES ('a','1','e','{}')`)
	b, err := s.Claim(context.Background(), 10)
	require.NoError(t, err)
	require.Len(t, b.Events, 1)
	require.Equal(t, int64(1), testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_tables WHERE tablename = 'outbox'`))
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  claim.Config
		want string
	}{
		{claim.Config{}, ""},
		{claim.Config{Table: "app.outbox"}, ""},
		{claim.Config{Table: "a.b.c"}, "Table"},
		{claim.Config{Table: "a."}, "Table"},
		{claim.Config{Lease: -time.Second}, "Lease"},
		{claim.Config{MaxAttempts: -1}, "MaxAttempts"},
		{claim.Config{RetryMin: -1}, "RetryMin"},
		{claim.Config{RetryMin: time.Hour, RetryMax: time.Minute}, "RetryMax"},
		{claim.Config{QueryTimeout: -1}, "QueryTimeout"},
		{claim.Config{Statuses: claim.Statuses{Pending: "it's"}}, "Statuses.Pending"},
		{claim.Config{Statuses: claim.Statuses{Published: "pending"}}, "Statuses"},
		{claim.Config{Columns: claim.Columns{Payload: "a\x00b"}}, "Columns.Payload"},
		{claim.Config{Ordering: "random"}, "Ordering"},
		{claim.Config{OrderingKey: []string{"a", "a"}}, "OrderingKey"},
		{claim.Config{OrderingKey: []string{"id"}}, "OrderingKey"},
	} {
		err := tc.cfg.Validate()
		if tc.want == "" {
			require.NoError(t, err)
			continue
		}
		require.ErrorContains(t, err, tc.want)
		// The setting is named by a field a caller can test, not only in
		// the text.
		var cerr *claim.ConfigError
		require.ErrorAs(t, err, &cerr)
		require.Equal(t, tc.want, cerr.Setting)
	}
}

func TestRetryDelay(t *testing.T) {
	t.Parallel()
	cfg := claim.Config{RetryMin: time.Second, RetryMax: time.Minute}
	for _, tc := range []struct {
		attempts int
		jitter   float64
		want     time.Duration
	}{
		{1, 0.5, time.Second},
		{2, 0.5, 2 * time.Second},
		{4, 0.5, 8 * time.Second},
		{7, 0.5, time.Minute},
		{100, 0.5, time.Minute},
		{1, 0, 750 * time.Millisecond},
		{1, 0.999999, 1249999 * time.Microsecond},
	} {
		require.InDelta(t, tc.want, cfg.RetryDelay(tc.attempts, tc.jitter), float64(time.Microsecond), "attempts %d", tc.attempts)
	}
}

func TestCheckNamesWhatIsMissing(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	s, err := claim.New(pool, claim.Config{})
	require.NoError(t, err)
	require.NoError(t, s.Check(context.Background()))
	s, err = claim.New(pool, claim.Config{Table: "nope"})
	require.NoError(t, err)
	require.ErrorContains(t, s.Check(context.Background()), `"nope" does not exist`)
	s, err = claim.New(pool, claim.Config{Columns: claim.Columns{EventID: "uuid"}})
	require.NoError(t, err)
	require.ErrorContains(t, s.Check(context.Background()), `column "uuid" does not exist`)
}

// pgx prepares each statement once per connection, and the relay's
// sessions run its cached generic plan (plan_cache_mode in
// claim.Config.Settings). Planned while the outbox was empty, the mark used
// to become a sequential scan repeated over the growing table. Planned on
// an empty table and run again after 20,000 inserts with no ANALYZE in
// between, every statement must still walk an index.
func TestGenericPlansStayOnIndexes(t *testing.T) {
	t.Parallel()
	url, setup := testkit.NewOutbox(t)
	testkit.Exec(t, setup, `ALTER TABLE outbox SET (autovacuum_enabled = off)`)
	pool, s := relayStore(t, url, claim.Config{})

	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	const lease = "'00000000-0000-4000-8000-000000000000'"
	args := map[string]string{
		"claim":            "500, 30000, " + lease + ", 16777216, 0, '{}'",
		"advance":          "'public.outbox_relay_seq_seq', 0, 100000, 256",
		"parked":           "'{1,2}'",
		"sweep":            "0, 50000",
		"mark_published":   "'{1,2,3}'",
		"release":          "'{1,2}', " + lease,
		"extend":           "'{1,2}', " + lease + ", 30000",
		"retry":            "'{1}', '{pending}', '{1000}', '{boom}', " + lease,
		"delete_published": "86400000, 1000, '-infinity'",
		"rescue_held":      "'{1,2}', '{1}', 1868722812",
		"rescue_instances": "5000, '{1,2}', '{3}', 1868722812",
		"release_leases":   "ARRAY[" + lease + "]::uuid[], 5000, '{1,2}'",
	}
	for name, a := range args {
		_, err := conn.Conn().Prepare(ctx, name, claim.Statements(s)[name])
		require.NoError(t, err, name)
		// The first run plans and caches the generic plan, on the empty table.
		_, err = conn.Exec(ctx, "EXECUTE "+name+"("+a+")")
		require.NoError(t, err, name)
	}
	testkit.InsertEvents(t, setup, 20000)
	testkit.Exec(t, setup, `UPDATE outbox SET status = 'published', published_at = now() - interval '2 days' WHERE id <= 10000`)

	for name, a := range args {
		plan := planOf(t, conn, "EXPLAIN (COSTS OFF) EXECUTE "+name+"("+a+")")
		require.NotContains(t, plan, "Seq Scan", "%s:\n%s", name, plan)
		require.NotContains(t, plan, "Bitmap", "%s:\n%s", name, plan)
	}
}

// relayStore opens a pool on url configured as the relay's
// (cfg.ConfigurePool), then changed by tune, if any, and a store with cfg
// on it.
func relayStore(t *testing.T, url string, cfg claim.Config, tune ...func(*pgxpool.Config)) (*pgxpool.Pool, *claim.Store) {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConfigurePool(pcfg)
	for _, f := range tune {
		f(pcfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, err := claim.New(pool, cfg)
	require.NoError(t, err)
	return pool, s
}

// planOf runs an EXPLAIN and returns its lines.
func planOf(t *testing.T, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, sql string, args ...any) string {
	t.Helper()
	rows, err := db.Query(context.Background(), sql, args...)
	require.NoError(t, err)
	var plan strings.Builder
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan.WriteString(line + "\n")
	}
	require.NoError(t, rows.Err())
	return plan.String()
}
