package inbox

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/jackc/pgx/v5/pgconn"
)

// Cleanup deletes this consumer's records older than Config.Retention (by
// their last change, updated_at), in statements of at most
// Config.CleanupBatch rows, until a batch comes back short, and returns how
// many it deleted. Run calls it every Config.CleanupInterval; call it
// yourself when that is disabled. A message whose record was deleted is
// processed again if it is delivered again.
func (c *Consumer) Cleanup(ctx context.Context) (int64, error) {
	var total int64
	for {
		n, err := c.cleanupBatch(ctx)
		total += n
		if err != nil {
			return total, err
		}
		if n < int64(c.cfg.CleanupBatch) {
			return total, nil
		}
	}
}

// cleanupBatch deletes at most CleanupBatch old records, in one statement
// under its own timeout.
func (c *Consumer) cleanupBatch(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	tag, err := c.exec(ctx, c.sql.cleanup, c.cfg.Name, c.cfg.Retention.Seconds(), c.cfg.CleanupBatch)
	if err != nil {
		return 0, fmt.Errorf("inbox: cleanup: delete records older than %v: %w", c.cfg.Retention, err)
	}
	return tag.RowsAffected(), nil
}

// runCleanup runs Cleanup at once, then every CleanupInterval (jittered by
// up to a tenth, so copies of a consumer drift apart), until ctx ends.
func (c *Consumer) runCleanup(ctx context.Context) {
	for {
		n, err := c.Cleanup(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			c.log.Warn("cleanup failed", "error", err)
		case n > 0:
			c.log.Info("cleanup deleted old records", "deleted", n, "retention", c.cfg.Retention)
		}
		interval := c.cfg.CleanupInterval
		if !sleep(ctx, interval-rand.N(interval/10+1)) {
			return
		}
	}
}

// exec runs one statement on Config.DB.
func (c *Consumer) exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return c.cfg.DB.Exec(ctx, sql, args...)
}

// queryRow runs one statement that returns a row into dest, on Config.DB;
// pgx.ErrNoRows when it returns none.
func (c *Consumer) queryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	return c.cfg.DB.QueryRow(ctx, sql, args...).Scan(dest...)
}
