package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/admin"
	"github.com/outboxrelay/outboxrelay/internal/cli"
	"github.com/outboxrelay/outboxrelay/internal/redact"
)

// AdminFlags are what the admin subcommands that reach the database share
// with run: the database, the table and its mapping, and the output format.
type AdminFlags struct {
	DatabaseFlags
	TableFlags
	QueryTimeout time.Duration `name:"query-timeout" env:"OUTBOX_QUERY_TIMEOUT" default:"1m" help:"Bound on each statement (status counts every published row still kept)."`
	JSON         bool          `name:"json" help:"Print JSON instead of a table."`
}

// ChannelFlag is the relay's notification channel, as run has it.
type ChannelFlag struct {
	Channel string `name:"channel" env:"OUTBOX_CHANNEL" default:"outbox" help:"Channel the outbox trigger NOTIFYs and the relay listens on."`
}

func (f ChannelFlag) check() error {
	if f.Channel == "" || len(f.Channel) > 63 {
		return cli.Usagef("--channel %q: must be 1 to 63 bytes", f.Channel)
	}
	return nil
}

// open checks the table flags, connects (a database it cannot reach is
// exit code 2, as for run) and returns the admin commands on the table,
// and a function that closes the connection.
func (f AdminFlags) open(ctx context.Context) (*admin.Admin, func(), error) {
	if f.QueryTimeout <= 0 {
		return nil, nil, cli.Usagef("--query-timeout %s: must be positive", f.QueryTimeout)
	}
	cc, err := f.claimConfig()
	if err != nil {
		return nil, nil, err
	}
	cc.QueryTimeout = f.QueryTimeout
	cfg, err := pgx.ParseConfig(f.DatabaseURL)
	if err != nil {
		return nil, nil, cli.Usagef("--database-url / DATABASE_URL: %v", redact.Error(err, f.DatabaseURL))
	}
	if err := requirePrimary(&cfg.Config, f.DatabaseURL, "--database-url / DATABASE_URL"); err != nil {
		return nil, nil, err // the commands read what the relay writes, and some write
	}
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "outboxrelay-admin"
	}
	// No session state, so the commands work through a transaction-mode
	// pool (PgBouncer) too: no prepared statements, and the statement
	// timeout sent with each statement rather than set for the session.
	cfg.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	connCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(connCtx, cfg)
	if err != nil {
		hint := ""
		if noPrimary(err) {
			hint = "; no server of the URL takes writes: the primary is down, or a failover is under way"
		}
		return nil, nil, cli.Usagef("PostgreSQL at %s unreachable: %v%s", redact.URL(f.DatabaseURL), redact.Error(err, f.DatabaseURL), hint)
	}
	closeConn := func() { conn.Close(context.WithoutCancel(ctx)) }
	timeout := map[string]string{"statement_timeout": strconv.FormatInt(f.QueryTimeout.Milliseconds(), 10)}
	a, err := admin.New(claim.NewLocalSettings(conn, timeout), cc)
	if err != nil {
		closeConn()
		return nil, nil, cli.Usage(err)
	}
	return a, closeConn, nil
}

// tableError makes a statement's error about the table, a column or the
// schema a configuration error (exit code 2) naming the flags at fault.
func (f AdminFlags) tableError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case pgerrcode.UndefinedTable, pgerrcode.InvalidSchemaName:
			return cli.Usagef("--table %s: %v", f.Table, err)
		case pgerrcode.UndefinedColumn:
			return cli.Usagef("--table %s and its --column-* / --ordering-key mapping: %v", f.Table, err)
		}
	}
	return err
}

// writeJSON prints v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// newTable is a tabwriter for a readable table.
func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

// eventJSON is an outbox row in the JSON of dead and requeue --dry-run.
type eventJSON struct {
	ID            int64     `json:"id"`
	EventID       string    `json:"event_id"`
	AggregateType string    `json:"aggregate_type"`
	AggregateID   string    `json:"aggregate_id"`
	EventType     string    `json:"event_type"`
	Exchange      *string   `json:"exchange"`
	RoutingKey    *string   `json:"routing_key"`
	Attempts      int       `json:"attempts"`
	LastError     *string   `json:"last_error"`
	CreatedAt     time.Time `json:"created_at"`
	// ContentType is null for the default; PayloadBytes is the size of a
	// binary payload, null for JSON.
	ContentType  *string `json:"content_type"`
	PayloadBytes *int64  `json:"payload_bytes"`
}

func eventsJSON(evs []admin.Event) []eventJSON {
	out := make([]eventJSON, len(evs))
	for i, e := range evs {
		out[i] = eventJSON(e)
	}
	return out
}

// writeEvents prints events as a table, one line each.
func writeEvents(w io.Writer, evs []admin.Event, now time.Time) error {
	tw := newTable(w)
	fmt.Fprintln(tw, "ID\tCREATED\tAGE\tAGGREGATE\tEVENT TYPE\tATTEMPTS\tLAST ERROR")
	for _, e := range evs {
		lastErr := "-"
		if e.LastError != nil {
			lastErr = cell(*e.LastError, 80)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\n", e.ID, e.CreatedAt.Local().Format(time.DateTime),
			age(now.Sub(e.CreatedAt)), cell(e.AggregateType+"/"+e.AggregateID, 40), cell(e.EventType, 30), e.Attempts, lastErr)
	}
	return tw.Flush()
}

// cell fits a value on one line of a table: control characters become
// spaces, and it is cut at max runes.
func cell(s string, max int) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	if r := []rune(s); len(r) > max {
		return string(r[:max-1]) + "…"
	}
	if s == "" {
		return `""`
	}
	return s
}

// age is a duration as a person reads it: 45s, 12m, 3h20m, 2d4h.
func age(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(max(d, 0)/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	default:
		return fmt.Sprintf("%dd%02dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
	}
}

// plural is noun, with an s unless n is 1.
func plural(n int64, noun string) string {
	if n == 1 {
		return noun
	}
	return noun + "s"
}
