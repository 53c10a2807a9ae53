package inbox_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/inbox"
)

func TestNewValidates(t *testing.T) {
	t.Parallel()
	pool := newPool(t, sharedDatabaseURL)
	valid := func() inbox.Config {
		return inbox.Config{
			AMQPURL: "amqp://guest:secret@127.0.0.1:5672/", Queue: "q", Name: "svc", DB: pool,
			Handler: func(context.Context, pgx.Tx, amqp.Delivery) error { return nil },
		}
	}
	for _, tc := range []struct {
		name   string
		change func(*inbox.Config)
		want   string
	}{
		{"AMQPURL", func(c *inbox.Config) { c.AMQPURL = "" }, "inbox: Config.AMQPURL is required"},
		{"bad AMQPURL", func(c *inbox.Config) { c.AMQPURL = "http://guest:secret@x/" }, "inbox: Config.AMQPURL: "},
		{"Queue", func(c *inbox.Config) { c.Queue = "" }, "inbox: Config.Queue is required"},
		{"Name", func(c *inbox.Config) { c.Name = "" }, "inbox: Config.Name is required"},
		{"DB", func(c *inbox.Config) { c.DB = nil }, "inbox: Config.DB is required"},
		{"Handler", func(c *inbox.Config) { c.Handler = nil }, "inbox: Config.Handler is required"},
		{"Table", func(c *inbox.Config) { c.Table = "a.b.c" }, "inbox: Config.Table: "},
		{"Prefetch", func(c *inbox.Config) { c.Prefetch = -1 }, "inbox: Config.Prefetch must not be negative"},
		{"Prefetch too large", func(c *inbox.Config) { c.Prefetch = 70000 }, "inbox: Config.Prefetch 70000 is more than AMQP's 65535"},
		{"MaxAttempts", func(c *inbox.Config) { c.MaxAttempts = -1 }, "inbox: Config.MaxAttempts must not be negative"},
		{"RetryMax", func(c *inbox.Config) { c.RetryMax = 1 }, "inbox: Config.RetryMax (1ns) is less than Config.RetryMin (100ms)"},
		{"Retention", func(c *inbox.Config) { c.Retention = -1 }, "inbox: Config.Retention must not be negative"},
		{"CleanupBatch", func(c *inbox.Config) { c.CleanupBatch = -1 }, "inbox: Config.CleanupBatch must not be negative"},
		{"ShutdownTimeout", func(c *inbox.Config) { c.ShutdownTimeout = -1 }, "inbox: Config.ShutdownTimeout must not be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := valid()
			tc.change(&cfg)
			_, err := inbox.New(cfg)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), "secret")
		})
	}
	_, err := inbox.New(valid())
	require.NoError(t, err)

	// Consumers of several names share one registry.
	reg := prometheus.NewRegistry()
	for _, name := range []string{"a", "b", "a"} {
		cfg := valid()
		cfg.Name, cfg.Registerer = name, reg
		_, err := inbox.New(cfg)
		require.NoError(t, err)
	}
}

// A queue that does not exist fails the first connection: Run returns the
// error instead of retrying a mistake.
func TestRunFailsOnMissingQueue(t *testing.T) {
	t.Parallel()
	pool := newPool(t, sharedDatabaseURL)
	c, err := inbox.New(inbox.Config{
		AMQPURL: amqpURL(), Queue: uniqueName("missing"), Name: "svc", DB: pool, Logger: testLogger(t),
		Handler: func(context.Context, pgx.Tx, amqp.Delivery) error { return nil },
	})
	require.NoError(t, err)
	err = c.Run(context.Background())
	var amqpErr *amqp.Error
	require.ErrorAs(t, err, &amqpErr)
	require.Equal(t, amqp.NotFound, amqpErr.Code)
}
