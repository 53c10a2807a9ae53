package claim

import "time"

// Statements exposes the rendered statements to tests (plan checks).
func Statements(s *Store) map[string]string {
	return map[string]string{
		"claim": s.q.claim, "mark_published": s.q.markPublished, "retry": s.q.retry,
		"release": s.q.release, "extend": s.q.extend, "delete_published": s.q.deletePublished, "check": s.q.check,
		"advance": s.q.advance, "parked": s.q.parked, "sweep": s.q.sweep,
		"rescue_held": s.q.rescueHeld, "rescue_instances": s.q.rescueInstances, "release_leases": s.q.releaseLeases,
	}
}

// OutcomeUnknown is outcomeUnknown, for its table test.
var OutcomeUnknown = outcomeUnknown

// DBOf is the connection the store runs its statements on: the pool, or
// the pool wrapped in LocalSettings when the store is pooled.
func DBOf(s *Store) DB { return s.db }

// CleanupFrom is where the store's next cleanup starts (DeletePublished).
func CleanupFrom(s *Store) time.Time {
	s.cleanupMu.Lock()
	defer s.cleanupMu.Unlock()
	return s.cleanupFrom
}
