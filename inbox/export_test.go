package inbox

import "context"

// CleanupBatch runs one cleanup statement, for the tests of its bound.
func (c *Consumer) CleanupBatch(ctx context.Context) (int64, error) { return c.cleanupBatch(ctx) }
