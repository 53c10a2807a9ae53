package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/cli"
	"github.com/outboxrelay/outboxrelay/migrations"
	"github.com/outboxrelay/outboxrelay/notify"
	outboxsql "github.com/outboxrelay/outboxrelay/sql"
)

// GateSequenceFlag names the notification gate's sequence.
type GateSequenceFlag struct {
	GateSeq string `name:"gate-sequence" env:"OUTBOX_GATE_SEQUENCE" help:"Sequence holding the notification gate, optionally schema-qualified (default: the table's name with _wakeup, in its schema)."`
}

// SchemaFlags are what the relay's schema is installed from: the table
// and its mapping, the channel its trigger notifies, the gate sequence.
// run, migrate and sql share them.
type SchemaFlags struct {
	TableFlags
	ChannelFlag
	GateSequenceFlag
}

// migrationsTable reports whether the flags name the table the built-in
// migrations create: "outbox", unqualified (found through the search_path,
// created in its first schema), with the default columns and statuses.
func (f SchemaFlags) migrationsTable(cc claim.Config) bool {
	def := claim.Config{}.WithDefaults()
	cc = cc.WithDefaults()
	return cc.Table == def.Table && cc.Columns == def.Columns && cc.Statuses == def.Statuses
}

// notMigrationsTable is run's refusal of a table the migrations do not
// create, before anything is created.
func notMigrationsTable(table string) error {
	return cli.Usagef("--table %s: the built-in migrations create only the table outbox, with the default columns and statuses; "+
		"install the relay's columns, indexes and trigger on your table with `outboxrelay migrate --table %[1]s` "+
		"(or pipe `outboxrelay sql --table %[1]s` to psql), with the same column, status, ordering and channel flags, "+
		"then run the relay with --no-migrate", table)
}

// installSettings are the install script's variables for the flags. The
// schema is left empty for an unqualified table: the caller fills it in.
func (f SchemaFlags) installSettings(cc claim.Config) (outboxsql.Settings, error) {
	table, err := cc.TableIdentifier()
	if err != nil {
		return outboxsql.Settings{}, cli.Usage(err)
	}
	cc = cc.WithDefaults()
	s := outboxsql.Settings{
		Table:           table[len(table)-1],
		Channel:         f.Channel,
		GateSequence:    f.GateSeq,
		IDColumn:        cc.Columns.ID,
		EventIDColumn:   cc.Columns.EventID,
		StatusColumn:    cc.Columns.Status,
		CreatedAtColumn: cc.Columns.CreatedAt,
		StatusPending:   cc.Statuses.Pending,
		StatusPublished: cc.Statuses.Published,
		StatusFailed:    cc.Statuses.Failed,
		Ordering:        string(cc.Ordering),
		OrderingKey:     strings.Join(cc.OrderingKey, ","),
	}
	if len(table) == 2 {
		s.Schema = table[0]
	}
	return s, nil
}

// tableSchemaSQL finds the schema of the table $1 (quoted, optionally
// qualified) the way the relay's statements find it; NULL if none.
const tableSchemaSQL = `SELECT n.nspname::text FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
	WHERE c.oid = to_regclass($1)`

// setupSchema brings the table up to what the relay needs on conn: the
// built-in migrations when the flags name their table, then the drop-in
// installation with the flags' settings (the ordering index, the channel
// and the gate sequence included), which adds only what is missing. A
// table the migrations do not create must exist.
func (f SchemaFlags) setupSchema(ctx context.Context, conn *pgx.Conn, log *slog.Logger, cc claim.Config) error {
	s, err := f.installSettings(cc)
	if err != nil {
		return err
	}
	if f.migrationsTable(cc) {
		if _, err := migrations.Migrate(ctx, conn, log); err != nil {
			return err
		}
	}
	table, _ := cc.TableIdentifier()
	var schema *string
	if err := conn.QueryRow(ctx, tableSchemaSQL, table.Sanitize()).Scan(&schema); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("look up table %s: %w", f.Table, err)
	}
	if schema == nil {
		return cli.Usagef("--table %s: no such table: the built-in migrations create only the table outbox (with the default "+
			"columns and statuses); create your outbox table first, then install the relay's parts on it with these flags", f.Table)
	}
	s.Schema = *schema
	return migrations.Install(ctx, conn, s, log)
}

// checkTrigger looks at the table's trigger once the schema is set up: one
// that notifies another channel than the relay's, or tries another
// channel's locks, is a usage error (exit 2); no trigger, an outdated one
// or a duplicate is a warning.
func (c *RunCmd) checkTrigger(ctx context.Context, db notify.Querier, log *slog.Logger, cc claim.Config) error {
	table, _ := cc.TableIdentifier()
	ts, err := notify.InspectTriggers(ctx, db, table)
	if err != nil {
		return err
	}
	err = ts.Check(c.Table, c.Channel)
	if mismatch := (*notify.TriggerMismatchError)(nil); errors.As(err, &mismatch) {
		return cli.Usage(err)
	}
	if err != nil {
		log.Warn("no notifications: events wait for the relay's sequence check or fallback poll", "err", err)
	}
	if old := ts.Outdated(); len(old) > 0 {
		log.Warn("the table's trigger predates the listen lock: producers notify even while no relay runs; "+
			"apply the migrations or re-run the install SQL (outboxrelay migrate, or outboxrelay sql | psql)", "triggers", old)
	}
	if ts.Duplicated() {
		log.Warn("more than one trigger on the table calls outboxrelay_notify(): every insert pays for each; "+
			"re-run the install SQL (outboxrelay migrate, or outboxrelay sql | psql), which keeps one", "table", c.Table)
	}
	return nil
}
