package main

import (
	"context"
	"io"

	"github.com/outboxrelay/outboxrelay/internal/cli"
	"github.com/outboxrelay/outboxrelay/internal/redact"
)

// MigrateCmd sets up the outbox table: the schema migrations for the
// table they create, and the relay's trigger, indexes and gate for the
// flags, on that table or on one of your own.
type MigrateCmd struct {
	DatabaseFlags
	cli.LogFlags
	SchemaFlags
}

// Run sets the schema up as run would before relaying, with the same
// table, column, status, ordering, channel and gate flags, and exits.
func (c *MigrateCmd) Run(ctx context.Context, stderr io.Writer) error {
	cc, err := c.claimConfig()
	if err != nil {
		return err
	}
	if err := c.check(); err != nil {
		return err
	}
	log := c.Logger(stderr).With("component", "migrate")
	conn, err := sessionConn(ctx, log, c.DatabaseURL, "--database-url / DATABASE_URL")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := c.setupSchema(ctx, conn, log, cc); err != nil {
		return err
	}
	log.Info("schema is up to date", "table", c.Table, "channel", c.Channel, "database", redact.URL(c.DatabaseURL))
	return nil
}
