package admin

import (
	"context"
	_ "embed"
	"fmt"
	"strings"
	"text/template"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/sqltmpl"
)

//go:embed queries.sql
var queriesSQL string

// DB is what the admin commands need of a connection: *pgx.Conn and
// *pgxpool.Pool have it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Admin runs the admin statements against one outbox table.
type Admin struct {
	db  DB
	cfg claim.Config
	q   map[string]string
}

// New validates cfg and renders the statements for its table. Each
// statement runs under cfg.QueryTimeout (default 10s); Status, which
// counts every published row still kept, may want more on a large table.
func New(db DB, cfg claim.Config) (*Admin, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	q, err := render(cfg)
	if err != nil {
		return nil, err
	}
	return &Admin{db: db, cfg: cfg, q: q}, nil
}

// Config returns the configuration with defaults filled in.
func (a *Admin) Config() claim.Config { return a.cfg }

// render fills queries.sql's templates for the table of cfg.
func render(cfg claim.Config) (map[string]string, error) {
	table, err := cfg.TableIdentifier()
	if err != nil {
		return nil, err
	}
	c := cfg.Columns
	data := map[string]string{"Table": sqltmpl.Identifier(table...)}
	for name, col := range map[string]string{
		"ID": c.ID, "Seq": c.Seq, "EventID": c.EventID, "AggregateType": c.AggregateType, "AggregateID": c.AggregateID,
		"EventType": c.EventType, "Payload": c.Payload, "Exchange": c.Exchange, "RoutingKey": c.RoutingKey,
		"Status": c.Status, "Attempts": c.Attempts, "AvailableAt": c.AvailableAt, "LeaseID": c.LeaseID,
		"LastError": c.LastError, "CreatedAt": c.CreatedAt, "PayloadBytes": c.PayloadBytes, "ContentType": c.ContentType,
	} {
		data[name] = sqltmpl.Identifier(col)
	}
	key := func(alias, suffix string) string {
		parts := make([]string, len(cfg.OrderingKey))
		for i, col := range cfg.OrderingKey {
			parts[i] = alias + "." + sqltmpl.Identifier(col) + suffix
		}
		return strings.Join(parts, ", ")
	}
	funcs := template.FuncMap{
		"key":     func(alias string) string { return key(alias, "") },
		"keyText": func(alias string) string { return key(alias, "::text") },
	}
	q, err := sqltmpl.Render(funcs, data, queriesSQL)
	if err != nil {
		return nil, fmt.Errorf("admin: %w", err)
	}
	return q, nil
}

// timeout bounds one statement.
func (a *Admin) timeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, a.cfg.QueryTimeout)
}

// Event is an outbox row as the admin commands show it.
type Event struct {
	ID            int64
	EventID       string
	AggregateType string
	AggregateID   string
	EventType     string
	Exchange      *string // nil: the relay's --exchange
	RoutingKey    *string // nil: <aggregate_type>.<event_type>
	Attempts      int
	LastError     *string
	CreatedAt     time.Time
	ContentType   *string // nil: the default (application/json, or application/octet-stream for a binary payload)
	PayloadBytes  *int64  // the size of a binary payload; nil for a JSON one
}

// events reads the rows of dead and requeue_preview, and the count of
// every match that each row carries.
func events(rows pgx.Rows) ([]Event, int64, error) {
	var total int64
	evs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Event, error) {
		var e Event
		err := row.Scan(&e.ID, &e.EventID, &e.AggregateType, &e.AggregateID, &e.EventType,
			&e.Exchange, &e.RoutingKey, &e.Attempts, &e.LastError, &e.CreatedAt, &e.ContentType, &e.PayloadBytes, &total)
		return e, err
	})
	return evs, total, err
}

// nullIf is nil for the zero value, meaning "any" or "the default" to a
// statement.
func nullIf[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}
