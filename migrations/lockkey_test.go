package migrations_test

import (
	"io/fs"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/lockkey"
	"github.com/outboxrelay/outboxrelay/migrations"
	outboxsql "github.com/outboxrelay/outboxrelay/sql"
)

// lockCall is one advisory lock function called in SQL with a literal
// key: the function, its first key, and whether a second key follows (a
// two-key lock, whose first key is a class; the second is always hashtext
// of a name).
type lockCall struct {
	fn     string
	key    int64
	twoKey bool
}

// A lock call whose first argument is a literal number, and any call of an
// advisory lock function at all.
var (
	literalLockCall = regexp.MustCompile(`\b(pg_(?:try_)?advisory_(?:xact_)?(?:un)?lock(?:_shared)?)\(\s*(\d+)\s*(,)?`)
	anyLockCall     = regexp.MustCompile(`\bpg_\w*advisory\w*\(`)
	// bigNumber is any number of nine digits or more, in code or comment.
	bigNumber = regexp.MustCompile(`\b\d{9,}\b`)
)

// The SQL files cannot import internal/lockkey, so they spell its keys out:
// every lock the migrations (released ones included, which are never
// edited) and the drop-in scripts take must be the one lockkey defines,
// call by call, and every big number they mention (in a comment, say) one
// of its keys. A key changed on one side alone fails here: the trigger
// would try a lock no relay takes. A migration already released keeps its
// numbers; should a key ever change, lockkey keeps the old one under a
// name of its own (as GateV2, which only migration 2 takes), and this
// table names it for that migration.
func TestSQLTakesTheLocksLockkeyDefines(t *testing.T) {
	t.Parallel()
	const (
		tryShared = "pg_try_advisory_xact_lock_shared"
		xactLock  = "pg_advisory_xact_lock"
	)
	// The trigger function tries the listen lock, then the gate's; the
	// trigger's WHEN clause the same two.
	triggerLocks := []lockCall{{tryShared, lockkey.Listen, true}, {tryShared, lockkey.Gate, true}}
	want := map[string][]lockCall{
		"002_wakeup_gate.sql":      {{tryShared, lockkey.GateV2, true}},
		"005_gate_lock.sql":        {{tryShared, lockkey.Gate, true}},
		"006_gate_when.sql":        {{tryShared, lockkey.Gate, true}},
		"007_notify_listening.sql": slices.Concat(triggerLocks, triggerLocks),
		"sql/outboxrelay_install.sql": slices.Concat(triggerLocks,
			[]lockCall{{xactLock, lockkey.Setup, false}}, triggerLocks),
	}
	files := map[string]string{
		"sql/outboxrelay_install.sql":   outboxsql.Install,
		"sql/outboxrelay_uninstall.sql": outboxsql.Uninstall,
		"sql/outboxrelay_role.sql":      outboxsql.Role,
	}
	names, err := fs.Glob(migrations.Files, "*.sql")
	require.NoError(t, err)
	require.NotEmpty(t, names)
	for _, name := range names {
		b, err := fs.ReadFile(migrations.Files, name)
		require.NoError(t, err)
		files[name] = string(b)
	}
	for name := range want {
		require.Contains(t, files, name, "the table names a file that is not there")
	}

	keys := map[int64]bool{}
	for _, k := range []int64{lockkey.GateV2, lockkey.Gate, lockkey.Sampler, lockkey.Listen, lockkey.Setup} {
		keys[k] = true
	}
	for name, text := range files {
		var got []lockCall
		for _, m := range literalLockCall.FindAllStringSubmatch(text, -1) {
			key, err := strconv.ParseInt(m[2], 10, 64)
			require.NoError(t, err)
			got = append(got, lockCall{fn: m[1], key: key, twoKey: m[3] != ""})
		}
		require.Len(t, anyLockCall.FindAllString(text, -1), len(got),
			"%s calls an advisory lock function with a key that is not a literal number, which this test cannot check", name)
		require.Equal(t, want[name], got, "%s: its advisory locks are not lockkey's", name)
		for _, n := range bigNumber.FindAllString(text, -1) {
			key, err := strconv.ParseInt(n, 10, 64)
			require.NoError(t, err, "%s: %s", name, n)
			require.True(t, keys[key], "%s mentions %s, which is no key of lockkey's", name, n)
		}
	}
}
