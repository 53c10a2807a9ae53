package relay

import "context"

// cleanup deletes old published rows at start and then every
// CleanupInterval, in batches until one comes back short.
func (r *Relay) cleanup(ctx context.Context) {
	for {
		r.cleanupOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-r.cfg.Clock.After(r.cfg.CleanupInterval):
		}
	}
}

func (r *Relay) cleanupOnce(ctx context.Context) {
	var total int64
	retention := max(r.cfg.Retention, 0) // negative: none
	for ctx.Err() == nil {
		n, err := r.store.DeletePublished(ctx, retention, r.cfg.CleanupBatch)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Error("cleanup failed", "err", err)
			}
			break
		}
		total += n
		if n < int64(r.cfg.CleanupBatch) {
			break
		}
	}
	if total > 0 {
		r.log.Info("cleanup deleted published events", "events", total, "older_than", retention)
	}
}
