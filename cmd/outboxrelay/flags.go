package main

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/cli"
	"github.com/outboxrelay/outboxrelay/internal/redact"
	"github.com/outboxrelay/outboxrelay/migrations"
)

// DatabaseFlags reach PostgreSQL.
type DatabaseFlags struct {
	DatabaseURL string `name:"database-url" env:"DATABASE_URL" default:"postgres://postgres@localhost:5432/postgres" help:"PostgreSQL connection URL; pool settings (pool_max_conns) and search_path may be given in it, and several hosts (pg-1:5432,pg-2:5432) to follow a failover: the relay connects only to a server that takes writes (target_session_attrs=read-write)."`
}

// poolConfig parses DATABASE_URL for the relay's pool, with its own
// application name, the settings the claim store needs
// (claim.Config.ConfigurePool) and, unless pool_max_conns is given, a
// connection for every worker plus three (the one the closed gate holds,
// the gate's other statements, cleanup and the listener's heartbeat), so a
// claim never queues for a connection.
func (f DatabaseFlags) poolConfig(store claim.Config, workers int) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(f.DatabaseURL)
	if err != nil {
		return nil, cli.Usagef("--database-url / DATABASE_URL: %v", redact.Error(err, f.DatabaseURL))
	}
	if !strings.Contains(f.DatabaseURL, "pool_max_conns") {
		cfg.MaxConns = int32(max(workers+3, 4))
	}
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = "outboxrelay"
	}
	if err := requirePrimary(&cfg.ConnConfig.Config, f.DatabaseURL, "--database-url / DATABASE_URL"); err != nil {
		return nil, err
	}
	cfg.AfterRelease = func(c *pgx.Conn) bool { return writable(c.PgConn()) }
	cfg.ShouldPing = func(_ context.Context, p pgxpool.ShouldPingParams) bool { return p.IdleDuration > poolPingIdle }
	store.ConfigurePool(cfg)
	return cfg, nil
}

// poolPingIdle is how long a pooled connection may have been idle and still
// be used without a ping first. pgx's default, a second, pinged before
// nearly every reading of the id sequence an idle relay makes once a
// second: half its round trips at rest. A connection that broke while idle
// for less fails its statement instead, which the loop that sent it
// retries (on another connection: pgx drops the broken one).
const poolPingIdle = 10 * time.Second

// connect opens the relay's pool and proves the database reachable,
// waiting while the servers that answer are all standbys; tracer, if not nil, sees every statement of the pool.
func (f DatabaseFlags) connect(ctx context.Context, log *slog.Logger, store claim.Config, workers int, tracer pgx.QueryTracer) (*pgxpool.Pool, error) {
	cfg, err := f.poolConfig(store, workers)
	if err != nil {
		return nil, err
	}
	if tracer != nil {
		cfg.ConnConfig.Tracer = tracer
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, cli.Usagef("PostgreSQL at %s: %v", redact.URL(f.DatabaseURL), redact.Error(err, f.DatabaseURL))
	}
	err = awaitPrimary(ctx, log, f.DatabaseURL, func(ctx context.Context) error {
		pingCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		return pool.Ping(pingCtx)
	})
	if err != nil {
		pool.Close()
		hint := ""
		if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == pgerrcode.ProtocolViolation {
			hint = pgbouncerHint
		}
		return nil, cli.Usagef("PostgreSQL at %s unreachable: %v%s", redact.URL(f.DatabaseURL), redact.Error(err, f.DatabaseURL), hint)
	}
	return pool, nil
}

// pgbouncerHint follows PgBouncer's refusal of the relay's startup
// parameters, which it only sets on a session of its own: PgBouncer answers
// a startup parameter it does not track with a protocol violation (08P01,
// "unsupported startup parameter"), which PostgreSQL itself never sends a
// client that speaks the protocol as pgx does.
const pgbouncerHint = "; this looks like PgBouncer: through a transaction-mode pool, give --listener-url " +
	"(OUTBOX_LISTENER_URL) a direct URL, or poll only with --no-listen, and the relay keeps no session state on --database-url"

// sessionConn opens one plain connection to rawURL for the migrations,
// on a primary (waiting while only standbys answer), and proves it a
// session of its own: through a transaction-mode pooler their advisory
// lock would not hold.
func sessionConn(ctx context.Context, log *slog.Logger, rawURL, flag string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(rawURL)
	if err != nil {
		return nil, cli.Usagef("%s: %v", flag, redact.Error(err, rawURL))
	}
	if err := requirePrimary(&cfg.Config, rawURL, flag); err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = "outboxrelay-migrate"
	// The install SQL says what it adds (a column, an index) as notices.
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		log.Info("database notice", "message", n.Message)
	}
	var conn *pgx.Conn
	err = awaitPrimary(ctx, log, rawURL, func(ctx context.Context) (err error) {
		connCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		conn, err = pgx.ConnectConfig(connCtx, cfg)
		return err
	})
	if err != nil {
		return nil, cli.Usagef("PostgreSQL at %s unreachable: %v", redact.URL(rawURL), redact.Error(err, rawURL))
	}
	checkCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := migrations.RequireSession(checkCtx, conn); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		if errors.Is(err, migrations.ErrTransactionPooled) {
			return nil, cli.Usagef("%s %s: %v; run `outboxrelay migrate` with a direct DATABASE_URL, "+
				"or give `run` a direct --listener-url, which it migrates through", flag, redact.URL(rawURL), err)
		}
		return nil, cli.Usagef("PostgreSQL at %s: %v", redact.URL(rawURL), redact.Error(err, rawURL))
	}
	return conn, nil
}
