package main

import (
	"context"
	"io"

	"github.com/outboxrelay/outboxrelay/migrations"
	"github.com/outboxrelay/outboxrelay/redact"
)

// MigrateCmd applies the schema migrations.
type MigrateCmd struct {
	DatabaseFlags
	LogFlags
}

// Run applies the migrations and reports the version reached.
func (c *MigrateCmd) Run(ctx context.Context, stderr io.Writer) error {
	log := c.logger(stderr).With("component", "migrate")
	conn, err := sessionConn(ctx, log, c.DatabaseURL, "--database-url / DATABASE_URL")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	v, err := migrations.Migrate(ctx, conn, log)
	if err != nil {
		return err
	}
	log.Info("schema is up to date", "version", v, "database", redact.URL(c.DatabaseURL))
	return nil
}
