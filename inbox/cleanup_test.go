package inbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/inbox"
)

// The cleanup deletes the consumer's records older than the window, in
// batches of at most CleanupBatch, and keeps the younger ones and other
// consumers'.
func TestCleanupHonoursTheWindow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	insert := func(consumer string, n int, age time.Duration) {
		e.exec(`INSERT INTO `+pgx.Identifier{e.table}.Sanitize()+` (consumer, message_id, processed_at, updated_at)
			SELECT $1, $1 || '-' || $3::float8 || '-' || i, now() - make_interval(secs => $3::float8), now() - make_interval(secs => $3::float8)
			FROM generate_series(1, $2) i`, consumer, n, age.Seconds())
	}
	insert("svc", 25, 25*time.Hour)  // older than the window
	insert("svc", 5, 23*time.Hour)   // younger
	insert("other", 5, 25*time.Hour) // another consumer's
	e.exec(`UPDATE ` + pgx.Identifier{e.table}.Sanitize() + ` SET processed_at = NULL, attempts = 2
		WHERE message_id IN ('svc-90000-1', 'svc-82800-1')`) // failed records age the same way

	cfg := e.config("svc", func(context.Context, pgx.Tx, amqp.Delivery) error { return nil })
	cfg.Retention, cfg.CleanupBatch, cfg.CleanupInterval = 24*time.Hour, 10, -1
	c, err := inbox.New(cfg)
	require.NoError(t, err)
	ctx := context.Background()
	left := func(consumer string) int {
		return e.count(`SELECT count(*) FROM `+pgx.Identifier{e.table}.Sanitize()+` WHERE consumer = $1`, consumer)
	}

	n, err := c.CleanupBatch(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(10), n, "one batch is bounded by CleanupBatch")
	require.Equal(t, 20, left("svc"))

	n, err = c.Cleanup(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(15), n)
	require.Equal(t, 5, left("svc"), "younger records deleted, or older ones kept")
	require.Equal(t, 0, e.count(`SELECT count(*) FROM `+pgx.Identifier{e.table}.Sanitize()+
		` WHERE consumer = 'svc' AND updated_at < now() - interval '24 hours'`))
	require.Equal(t, 5, left("other"), "another consumer's records deleted")

	n, err = c.Cleanup(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
}

// Run cleans up at its start and then every CleanupInterval.
func TestRunCleansUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for i := range 3 {
		e.exec(`INSERT INTO `+pgx.Identifier{e.table}.Sanitize()+` (consumer, message_id, processed_at, updated_at)
			VALUES ('svc', $1, now() - interval '8 days', now() - interval '8 days')`, fmt.Sprint("old-", i))
	}
	cfg := e.config("svc", func(context.Context, pgx.Tx, amqp.Delivery) error { return nil })
	cfg.CleanupInterval = 50 * time.Millisecond // default Retention: 7 days
	e.start(cfg)
	eventually(t, wait, func() bool {
		return e.count(`SELECT count(*) FROM `+pgx.Identifier{e.table}.Sanitize()) == 0
	}, "the old records were not cleaned up")
	e.exec(`INSERT INTO ` + pgx.Identifier{e.table}.Sanitize() + ` (consumer, message_id, processed_at, updated_at)
		VALUES ('svc', 'later', now() - interval '8 days', now() - interval '8 days'), ('svc', 'young', now(), now())`)
	eventually(t, wait, func() bool {
		return e.count(`SELECT count(*) FROM `+pgx.Identifier{e.table}.Sanitize()+` WHERE message_id = 'later'`) == 0
	}, "the cleanup did not run again")
	require.Equal(t, 1, e.count(`SELECT count(*) FROM `+pgx.Identifier{e.table}.Sanitize()+` WHERE message_id = 'young'`))
}
