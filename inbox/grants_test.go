package inbox_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/inbox"
)

// The README's GRANTs are all a consumer needs: one running as a role with
// only those processes, skips a duplicate, counts a failure, dead-letters
// (resetting the attempts) and cleans up.
func TestLeastPrivilegeGrants(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	_, block, ok := strings.Cut(string(readme), "<!-- grants: TestLeastPrivilegeGrants runs this block -->\n```sql\n")
	require.True(t, ok, "the README's grants block is missing")
	block, _, _ = strings.Cut(block, "```")
	role := uniqueName("inbox_role")
	grants := strings.ReplaceAll(block, " ON inbox TO ", " ON "+pgx.Identifier{e.table}.Sanitize()+" TO ")
	grants = strings.ReplaceAll(grants, " TO shipping;", " TO "+pgx.Identifier{role}.Sanitize()+";")
	require.Equal(t, 3, strings.Count(grants, role), "the grants block changed: teach this test")
	e.exec(`CREATE ROLE ` + pgx.Identifier{role}.Sanitize() + ` NOLOGIN`)
	t.Cleanup(func() {
		e.exec(`DROP OWNED BY ` + pgx.Identifier{role}.Sanitize())
		e.exec(`DROP ROLE ` + pgx.Identifier{role}.Sanitize())
	})
	e.exec(grants)
	e.exec(`GRANT INSERT ON ` + pgx.Identifier{e.effects}.Sanitize() + ` TO ` + pgx.Identifier{role}.Sanitize()) // the handler's own table

	cfg, err := pgxpool.ParseConfig(sharedDatabaseURL)
	require.NoError(t, err)
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, `SET ROLE `+pgx.Identifier{role}.Sanitize())
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var got calls
	c := e.config("svc", func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
		got.add(d.MessageId)
		if d.MessageId == "poison" {
			return errors.New("poison")
		}
		return e.insertEffect(ctx, tx, d.MessageId, "")
	})
	c.DB, c.MaxAttempts, c.CleanupInterval = pool, 2, time.Hour
	e.exec(`INSERT INTO ` + pgx.Identifier{e.table}.Sanitize() + ` (consumer, message_id, updated_at) VALUES ('svc', 'old', now() - interval '8 days')`)
	e.start(c)
	e.publish("m1", "", nil)
	e.publish("m1", "", nil)
	e.publish("poison", "", nil)
	require.Equal(t, "poison", e.getFrom(e.dlq, wait).MessageId)
	eventually(t, wait, func() bool {
		r, _ := e.record("svc", "poison")
		_, old := e.record("svc", "old")
		return e.metric("inbox_duplicates_total", nil) == 1 && r.Attempts == 0 && !old
	}, "the duplicate, the reset or the cleanup failed")
	require.Equal(t, 1, got.of("m1"))
	require.Equal(t, 2, got.of("poison"))

	// The role may not do more.
	_, err = pool.Exec(ctx, `TRUNCATE `+pgx.Identifier{e.table}.Sanitize())
	require.Error(t, err)
	require.Error(t, inbox.Migrate(ctx, pool, uniqueName("inbox")))
}
