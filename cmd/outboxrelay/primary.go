package main

import (
	"context"
	"errors"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/outboxrelay/internal/cli"
	"github.com/outboxrelay/outboxrelay/internal/redact"
)

// The relay writes, so every connection it makes must reach a server that
// takes writes: with a multi-host URL (host=a,b), the primary among them,
// and after a failover the promoted one. A connection whose server turns
// read-only is dropped when it is released, so the next one is dialled
// afresh; and a relay that starts while only standbys answer waits for a
// primary instead of failing.

// sessionAttrs finds the target_session_attrs a URL or keyword/value DSN
// asks for.
var sessionAttrs = regexp.MustCompile(`target_session_attrs=([^&\s]*)`)

// requirePrimary makes cfg connect only to a server that takes writes:
// target_session_attrs=read-write unless the URL says otherwise. A URL that
// asks for a standby or a read-only server is refused, naming flag.
func requirePrimary(cfg *pgconn.Config, rawURL, flag string) error {
	if m := sessionAttrs.FindStringSubmatch(rawURL); m != nil {
		switch attrs := strings.Trim(m[1], `'"`); attrs {
		case "", "any", "read-write", "primary":
		default:
			return cli.Usagef("%s: target_session_attrs=%s: the relay writes, so it needs a primary; "+
				"give read-write (its default) or primary", flag, attrs)
		}
	}
	if cfg.ValidateConnect == nil { // no target_session_attrs, or "any"
		cfg.ValidateConnect = pgconn.ValidateConnectTargetSessionAttrsReadWrite
	}
	return nil
}

// writable reports whether conn's server still took writes when it last
// said: PostgreSQL 14 and later report default_transaction_read_only and
// in_hot_standby whenever they change, for instance when an old primary is
// fenced with ALTER SYSTEM SET default_transaction_read_only = on. As a
// pool's AfterRelease it drops a connection that could only fail the
// relay's writes with "cannot execute UPDATE in a read-only transaction".
func writable(conn *pgconn.PgConn) bool {
	return conn.ParameterStatus("default_transaction_read_only") != "on" &&
		conn.ParameterStatus("in_hot_standby") != "on"
}

// noPrimary reports whether err says the servers that answered were all
// read-only: a standby, or a failover under way.
func noPrimary(err error) bool { return errors.Is(err, pgconn.ErrReadOnlyConnection) }

// awaitPrimary runs try until it succeeds, fails for another reason than
// noPrimary, or ctx ends, waiting between attempts (up to 5 s) and warning
// each time that no server of rawURL takes writes yet.
func awaitPrimary(ctx context.Context, log *slog.Logger, rawURL string, try func(context.Context) error) error {
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(250*time.Millisecond),
		backoff.WithMaxInterval(5*time.Second),
		backoff.WithMaxElapsedTime(0),
	)
	for {
		err := try(ctx)
		if err == nil || !noPrimary(err) {
			return err
		}
		wait := b.NextBackOff()
		log.Warn("no server of the database URL takes writes yet: waiting for a primary",
			"database", redact.URL(rawURL), "retry_in", wait.Round(time.Millisecond), "err", redact.Error(err, rawURL))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}
