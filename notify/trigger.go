package notify

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Querier runs a query; a *pgxpool.Pool and a *pgx.Conn satisfy it.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// ErrNoTrigger is Triggers.Check's error when no enabled trigger on the
// table calls outboxrelay_notify(): producers' events then wait for the
// relay to find them through the id sequence or the fallback poll.
var ErrNoTrigger = errors.New("no outbox trigger")

// TriggerMismatchError is Triggers.Check's error when the table's trigger
// notifies another channel than the relay listens on, or tries the locks of
// another channel: the relay would get no notification, and its gate and
// listen lock would silence nothing.
type TriggerMismatchError struct {
	Table   string  // the table, as the relay names it
	Trigger Trigger // the trigger at fault
	Channel string  // the relay's channel
}

func (e *TriggerMismatchError) Error() string {
	locks := "its gate locks are those of channel " + strconv.Quote(e.Trigger.Channel)
	if e.Trigger.HasWhen {
		locks = fmt.Sprintf("its WHEN clause tries the locks of %s", quoteAll(e.Trigger.WhenChannels))
	}
	return fmt.Sprintf("trigger %s on %s notifies channel %q and %s, but the relay's --channel is %q: "+
		"run `outboxrelay migrate --channel %s` (or pipe `outboxrelay sql --channel %s` to psql) with the table's flags, "+
		"or give the relay --channel %q",
		e.Trigger.Name, e.Table, e.Trigger.Channel, locks, e.Channel, e.Channel, e.Channel, e.Trigger.Channel)
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return strings.Join(q, " and ")
}

// Trigger is one trigger on the outbox table that calls
// outboxrelay_notify(), as the catalog shows it.
type Trigger struct {
	Name    string
	Enabled bool // not DISABLEd (enabled, ALWAYS or REPLICA)
	// Channel is its first argument, the channel it notifies; Gated says a
	// second one (the gate sequence) follows, which makes the function
	// respect the gate and listen locks.
	Channel string
	Gated   bool
	// HasWhen says it has a WHEN clause; WhenClasses and WhenChannels are
	// the first keys and the channels of the advisory locks the clause
	// tries (hashtext of each channel being the second key).
	HasWhen      bool
	WhenClasses  []int64
	WhenChannels []string
}

// Triggers are the table's triggers that call outboxrelay_notify().
type Triggers []Trigger

// triggersSQL lists the triggers on $1 (regclass text) that call a
// function named outboxrelay_notify, with their arguments (each ended by a
// zero byte) and their definition as PostgreSQL prints it.
const triggersSQL = `SELECT t.tgname::text, t.tgenabled <> 'D', t.tgargs, pg_get_triggerdef(t.oid)
	FROM pg_trigger AS t JOIN pg_proc AS p ON p.oid = t.tgfoid
	WHERE t.tgrelid = $1::regclass AND NOT t.tgisinternal AND p.proname = 'outboxrelay_notify'
	ORDER BY t.tgname`

// whenLock matches an advisory lock try in a trigger's printed WHEN
// clause: its class and its channel's string literal.
var whenLock = regexp.MustCompile(`pg_try_advisory_xact_lock_shared\((\d+), hashtext\('((?:[^']|'')*)'::text\)\)`)

// InspectTriggers reads the triggers on table that call
// outboxrelay_notify(). It needs no privilege but to read the catalog.
func InspectTriggers(ctx context.Context, db Querier, table pgx.Identifier) (Triggers, error) {
	rows, err := db.Query(ctx, triggersSQL, table.Sanitize())
	if err != nil {
		return nil, fmt.Errorf("inspect trigger: %w", err)
	}
	ts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Trigger, error) {
		var (
			t    Trigger
			args []byte
			def  string
		)
		if err := row.Scan(&t.Name, &t.Enabled, &args, &def); err != nil {
			return Trigger{}, err
		}
		parts := bytes.Split(bytes.TrimSuffix(args, []byte{0}), []byte{0})
		t.Channel = string(parts[0])
		t.Gated = len(parts) > 1
		if _, when, ok := strings.Cut(def, " WHEN "); ok {
			when, _, _ = strings.Cut(when, " EXECUTE ")
			t.HasWhen = true
			for _, m := range whenLock.FindAllStringSubmatch(when, -1) {
				class, _ := strconv.ParseInt(m[1], 10, 64) // \d+
				t.WhenClasses = append(t.WhenClasses, class)
				t.WhenChannels = append(t.WhenChannels, strings.ReplaceAll(m[2], "''", "'"))
			}
		}
		return t, nil
	})
	if err != nil {
		return nil, fmt.Errorf("inspect trigger: %w", err)
	}
	return ts, nil
}

// Check returns ErrNoTrigger unless some trigger is enabled, and a
// *TriggerMismatchError for an enabled trigger that notifies another
// channel than channel or whose WHEN clause tries another channel's locks.
// table names the table in the error.
func (ts Triggers) Check(table, channel string) error {
	enabled := 0
	for _, t := range ts {
		if !t.Enabled {
			continue
		}
		enabled++
		mismatch := t.Channel != channel
		for _, c := range t.WhenChannels {
			mismatch = mismatch || c != channel
		}
		if mismatch {
			return &TriggerMismatchError{Table: table, Trigger: t, Channel: channel}
		}
	}
	if enabled == 0 {
		return fmt.Errorf("%w on %s calls outboxrelay_notify(): apply the migrations or sql/outboxrelay_install.sql", ErrNoTrigger, table)
	}
	return nil
}

// Outdated lists the enabled, gated triggers whose WHEN clause does not
// try the listen lock (installed before it existed): their producers
// notify even while no relay listens.
func (ts Triggers) Outdated() []string {
	var names []string
	for _, t := range ts {
		if t.Enabled && t.Gated && t.HasWhen && !slices.Contains(t.WhenClasses, ListenLockClass) {
			names = append(names, t.Name)
		}
	}
	return names
}

// Duplicated reports whether more than one enabled trigger calls
// outboxrelay_notify(): every insert then queues the function twice.
func (ts Triggers) Duplicated() bool {
	n := 0
	for _, t := range ts {
		if t.Enabled {
			n++
		}
	}
	return n > 1
}
