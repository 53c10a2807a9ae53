package claim_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/lockkey"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// A claim's lease carries the instance the relay holds as a version 8
// UUID, the instance in its first 4 bytes; while it holds none, a random
// version 4 UUID. Both keep the RFC 9562 variant, and PostgreSQL reads the
// instance back from the stored lease as the rescue's statements do.
func TestLeaseCarriesTheInstance(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	var instance atomic.Uint32
	s, err := claim.New(pool, claim.Config{Instance: instance.Load})
	require.NoError(t, err)
	for _, id := range []uint32{0, 0x12345678, 0xfedcba98} {
		instance.Store(id)
		testkit.InsertEvents(t, pool, 1)
		b, err := s.Claim(context.Background(), 10)
		require.NoError(t, err)
		require.Len(t, b.Events, 1)
		holder, ok := b.Lease.Holder()
		require.Equal(t, id != 0, ok, "lease %s", b.Lease)
		require.Equal(t, id, holder, "lease %s", b.Lease)
		version := map[bool]byte{true: 8, false: 4}[id != 0]
		require.Equal(t, version, b.Lease[6]>>4, "version of %s", b.Lease)
		require.Equal(t, byte(0b10), b.Lease[8]>>6, "variant of %s", b.Lease)
		stored := testkit.QueryInt(t, pool, `SELECT CASE WHEN substr(lease_id::text, 15, 1) = '8'
				THEN ('x' || left(lease_id::text, 8))::bit(32)::bigint ELSE -1 END
			FROM outbox WHERE id = $1`, b.Events[0].ID)
		if id == 0 {
			require.EqualValues(t, -1, stored)
		} else {
			require.EqualValues(t, id, stored)
		}
	}
}

// instanceLock holds the instance lock of id on a session of its own, as
// a relay's listening connection does, until the returned function ends
// the session and the lock is gone from pg_locks.
func instanceLock(t *testing.T, url string, id uint32) (end func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	var got bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1::int4, $2::int4)`, int32(lockkey.Relay), int32(id)).Scan(&got))
	require.True(t, got)
	var once atomic.Bool
	end = func() {
		if !once.CompareAndSwap(false, true) {
			return
		}
		require.NoError(t, conn.Close(ctx))
		pool := testkit.NewPool(t, url)
		testkit.WaitFor(t, 10*time.Second, "the instance lock gone", func() bool {
			return testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_locks
				WHERE locktype = 'advisory' AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = 2`,
				int32(lockkey.Relay), int32(id)) == 0
		})
	}
	t.Cleanup(end)
	return end
}

// watch advances s until it watches rows leased by another relay (its
// first advance sets the frontier; the next reads the rows above the
// floor).
func watch(t *testing.T, s *claim.Store) {
	t.Helper()
	testkit.WaitFor(t, 10*time.Second, "rows of another relay seen", func() bool {
		require.NoError(t, s.Advance(context.Background()))
		return s.Watching()
	})
}

// relayOn is a store on url whose claims carry instance id (none for 0).
func relayOn(t *testing.T, url string, id uint32) *claim.Store {
	t.Helper()
	s, err := claim.New(testkit.NewPool(t, url), claim.Config{Instance: func() uint32 { return id }})
	require.NoError(t, err)
	return s
}

// Relay A claims 500 rows under its instance; relay B, advancing, sees the
// first 256 of them above its floor. While A's instance lock is held,
// Rescue leaves them alone and B cannot claim them; once A's session ends,
// B's next Rescue makes every row of A due at once, those beyond what B
// read included, and B claims them all. B never rescues its own rows:
// with B's own lock gone, its claims wait for a third relay.
func TestRescueTakesOverTheRowsOfADeadRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool := testkit.NewOutbox(t)
	const a, b, c = 0xa0000001, 0xb0000002, 0xc0000003
	endA := instanceLock(t, url, a)
	endB := instanceLock(t, url, b)
	instanceLock(t, url, c)
	relayA, relayB, relayC := relayOn(t, url, a), relayOn(t, url, b), relayOn(t, url, c)
	testkit.InsertEvents(t, pool, 600)
	held, err := relayA.Claim(ctx, 500)
	require.NoError(t, err)
	require.Len(t, held.Events, 500)

	watch(t, relayB) // B sees A's leased rows above its floor
	n, err := relayB.Rescue(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "A lives: its rows stay leased")
	rest, err := relayB.Claim(ctx, 500)
	require.NoError(t, err)
	require.Len(t, rest.Events, 100, "B claims only what A left")

	endA()
	n, err = relayB.Rescue(ctx) // a round a second at most: this one is not due yet
	require.NoError(t, err)
	require.Zero(t, n)
	testkit.WaitFor(t, 5*time.Second, "B's next round", func() bool {
		n, err = relayB.Rescue(ctx)
		require.NoError(t, err)
		return n > 0
	})
	require.EqualValues(t, 500, n, "every row of A, those B never read included")
	took, err := relayB.Claim(ctx, 1000)
	require.NoError(t, err)
	require.Equal(t, ids(held.Events), ids(took.Events), "B claims what A held")
	require.EqualValues(t, 500, testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE attempts = 2`),
		"a rescue keeps the dead claim's attempt: it may have been published")

	// B's own rows, with B's lock gone: B leaves them, C takes them over.
	endB()
	require.NoError(t, relayB.Advance(ctx))
	n, err = relayB.Rescue(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a relay never rescues its own claims")
	watch(t, relayC)
	n, err = relayC.Rescue(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 600, n, "C takes over B's rows at its first sight of B's instance")
}

// A claim carries no instance while its relay holds none: its rows wait
// for their lease, whoever looks.
func TestClaimWithoutInstanceWaitsForItsLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, pool := testkit.NewOutbox(t)
	const b = 0xb0000002
	instanceLock(t, url, b)
	none, relayB := relayOn(t, url, 0), relayOn(t, url, b)
	testkit.InsertEvents(t, pool, 10)
	held, err := none.Claim(ctx, 10)
	require.NoError(t, err)
	require.Len(t, held.Events, 10)
	for range 3 { // the frontier, then the rows above the floor
		require.NoError(t, relayB.Advance(ctx))
	}
	require.False(t, relayB.Watching())
	n, err := relayB.Rescue(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
}

// A claim whose reply is lost (the link to PostgreSQL drops what the server
// sends) commits on the server and fails on the client. Probe fails while
// the database does not answer; once it does, ReleaseLost gives the
// claim's rows back by their lease, due at once and their attempt not
// counted.
func TestReleaseLostGivesBackAClaimWhoseReplyWasLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL, pool := testkit.NewOutbox(t)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	proxy := testkit.NewProxy(t, u.Host)
	u.Host = proxy.Addr()
	// One connection, on which the claim is prepared before the replies
	// are lost: a claim not yet prepared would wait for its Parse's reply,
	// and never run.
	s, err := claim.New(testkit.NewPoolOf(t, u.String(), 1), claim.Config{QueryTimeout: 500 * time.Millisecond})
	require.NoError(t, err)
	_, err = s.Claim(ctx, 500)
	require.NoError(t, err)
	testkit.InsertEvents(t, pool, 20)

	proxy.LoseReplies()
	_, err = s.Claim(ctx, 500)
	require.Error(t, err)
	require.EqualValues(t, 20, testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE lease_id IS NOT NULL AND available_at > now()`),
		"the claim committed on the server")
	proxy.Blackhole()
	require.Error(t, s.Probe(ctx), "the database does not answer")

	proxy.Heal()
	require.NoError(t, s.Probe(ctx))
	n, err := s.ReleaseLost(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 20, n)
	require.EqualValues(t, 20, testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox
		WHERE lease_id IS NULL AND available_at <= now() AND attempts = 0`))
	n, err = s.ReleaseLost(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "released once")
	b, err := s.Claim(ctx, 500)
	require.NoError(t, err)
	require.Len(t, b.Events, 20)
}

// safeErr is an error pgx knows came before anything was sent.
type safeErr struct{}

func (safeErr) Error() string     { return "dial refused" }
func (safeErr) SafeToRetry() bool { return true }

// A failed claim's outcome is unknown unless the server answered (its
// error rolled the statement back) or pgx knows nothing was sent.
func TestOutcomeUnknown(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err     error
		unknown bool
	}{
		{fmt.Errorf("claim batch: %w", &pgconn.PgError{Code: "57014"}), false},
		{fmt.Errorf("claim batch: %w", safeErr{}), false},
		{fmt.Errorf("claim batch: %w", context.DeadlineExceeded), true},
		{fmt.Errorf("claim batch: %w", errors.New("unexpected EOF")), true},
	} {
		require.Equal(t, c.unknown, claim.OutcomeUnknown(c.err), "%v", c.err)
	}
}
