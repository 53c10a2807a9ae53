package notify

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

func inspect(t *testing.T, pool *pgxpool.Pool) Triggers {
	t.Helper()
	ts, err := InspectTriggers(context.Background(), pool, pgx.Identifier{"outbox"})
	require.NoError(t, err)
	return ts
}

// The migrated table's trigger notifies the default channel and tries its
// locks: it passes for that channel, and for another channel it is a
// mismatch naming both.
func TestCheckTriggerFindsAnotherChannel(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	ts := inspect(t, pool)
	require.Equal(t, Triggers{{Name: "outbox_notify", Enabled: true, Channel: "outbox", Gated: true, HasWhen: true,
		WhenClasses: []int64{ListenLockClass, GateLockClass}, WhenChannels: []string{"outbox", "outbox"}}}, ts)
	require.NoError(t, ts.Check("outbox", "outbox"))
	require.Empty(t, ts.Outdated())
	require.False(t, ts.Duplicated())

	err := ts.Check("outbox", "custom")
	var mismatch *TriggerMismatchError
	require.ErrorAs(t, err, &mismatch)
	require.Equal(t, "custom", mismatch.Channel)
	require.Equal(t, "outbox_notify", mismatch.Trigger.Name)
	require.ErrorContains(t, err, `notifies channel "outbox"`)
	require.ErrorContains(t, err, `--channel is "custom"`)
}

// A trigger that notifies the relay's channel but tries another channel's
// locks in its WHEN clause would keep notifying through the relay's closed
// gate, and not notify while the relay listens: a mismatch too. A
// channel's quotes are read back as written.
func TestCheckTriggerFindsAnotherChannelsLocks(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	testkit.Exec(t, pool, fmt.Sprintf(`CREATE OR REPLACE TRIGGER outbox_notify AFTER INSERT ON outbox FOR EACH STATEMENT
		WHEN (NOT pg_try_advisory_xact_lock_shared(%d, hashtext('it''s')) AND pg_try_advisory_xact_lock_shared(%d, hashtext('outbox')))
		EXECUTE FUNCTION outboxrelay_notify('outbox', 'public.outbox_wakeup')`, ListenLockClass, GateLockClass))
	ts := inspect(t, pool)
	require.Equal(t, []string{"it's", "outbox"}, ts[0].WhenChannels)
	var mismatch *TriggerMismatchError
	require.ErrorAs(t, ts.Check("outbox", "outbox"), &mismatch)
	require.ErrorContains(t, ts.Check("outbox", "outbox"), `"it's" and "outbox"`)
}

// No enabled trigger calling outboxrelay_notify(): disabled, or dropped.
func TestCheckTriggerFindsNone(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	testkit.Exec(t, pool, `ALTER TABLE outbox DISABLE TRIGGER outbox_notify`)
	require.ErrorIs(t, inspect(t, pool).Check("outbox", "outbox"), ErrNoTrigger)
	testkit.Exec(t, pool, `DROP TRIGGER outbox_notify ON outbox`)
	ts := inspect(t, pool)
	require.Empty(t, ts)
	require.ErrorIs(t, ts.Check("outbox", "outbox"), ErrNoTrigger)
}

// A trigger of version 6 (WHEN without the listen lock) is outdated; two
// triggers calling the function are a duplicate.
func TestCheckTriggerFindsOutdatedAndDuplicated(t *testing.T) {
	t.Parallel()
	_, pool := testkit.NewOutbox(t)
	testkit.Exec(t, pool, fmt.Sprintf(`CREATE OR REPLACE TRIGGER outbox_notify AFTER INSERT ON outbox FOR EACH STATEMENT
		WHEN (pg_try_advisory_xact_lock_shared(%d, hashtext('outbox')))
		EXECUTE FUNCTION outboxrelay_notify('outbox', 'public.outbox_wakeup')`, GateLockClass)) // as migration 6 made it
	ts := inspect(t, pool)
	require.NoError(t, ts.Check("outbox", "outbox"))
	require.Equal(t, []string{"outbox_notify"}, ts.Outdated())

	testkit.Exec(t, pool, `CREATE TRIGGER outboxrelay_notify AFTER INSERT ON outbox FOR EACH STATEMENT
		EXECUTE FUNCTION outboxrelay_notify('outbox', 'public.outbox_wakeup')`)
	ts = inspect(t, pool)
	require.True(t, ts.Duplicated())
	require.Equal(t, []string{"outbox_notify"}, ts.Outdated(), "a trigger without WHEN leaves the listen lock to the function")
}

// The trigger function and the trigger's WHEN clause are written out
// twice, in the latest migration and in the drop-in script, with the lock
// classes Go knows as ListenLockClass and GateLockClass: all must agree,
// and the two functions must be the same text (the script leaves an
// identical function alone, and replaces any other).
func TestTriggerSQLAgreesWithTheLocks(t *testing.T) {
	read := func(path, from, to string) string {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		_, rest, ok := strings.Cut(string(b), from)
		require.True(t, ok, "%s has no %q", path, from)
		part, _, ok := strings.Cut(rest, to)
		require.True(t, ok, "%s has no %q after %q", path, to, from)
		return part
	}
	migration := read("../migrations/007_notify_listening.sql", "LANGUAGE plpgsql AS $$", "$$;")
	install := read("../sql/outboxrelay_install.sql", "body      constant text := $body$", "$body$;")
	require.Equal(t, migration, install, "the migration's and the drop-in's trigger functions differ")
	listen, gate := strconv.Itoa(ListenLockClass), strconv.Itoa(GateLockClass)
	require.Contains(t, install, "pg_try_advisory_xact_lock_shared("+listen+", hashtext(TG_ARGV[0]))")
	require.Contains(t, install, "NOT pg_try_advisory_xact_lock_shared("+gate+", hashtext(TG_ARGV[0]))")
	// The triggers try the same locks in their WHEN clauses first.
	when := "NOT pg_try_advisory_xact_lock_shared(" + listen + ", hashtext(%L)) AND pg_try_advisory_xact_lock_shared(" + gate + ", hashtext(%L))"
	for _, path := range []string{"../migrations/007_notify_listening.sql", "../sql/outboxrelay_install.sql"} {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		require.Contains(t, string(b), when, path)
	}
}
