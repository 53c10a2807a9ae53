package claim

// Rows that a claim holds but that no relay will settle wait for their
// lease to expire (Config.Lease, 30 s by default), unless they are freed
// sooner. Two kinds are:
//
// The rows of a relay that died. A relay that holds an instance lock
// (Config.Instance: the lock (lockkey.Relay, id), held on a session that
// lives as long as the relay) stamps the id on its leases: a version 8
// UUID whose first 4 bytes are the id. Advance notes the leased heads it
// reads above the floor that carry another relay's instance, and Rescue,
// at once for an instance it has not seen before and every RescueEvery
// while it knows of any, makes those whose instance's lock is gone from
// pg_locks due now, and then every row of those instances above the floor
// and among the parked ones: the next claim, of whichever relay, takes
// them. Only one relay's claim can take a row, and the dead one publishes
// nothing more, so in ordered mode too each aggregate still has one event
// in flight at most. A relay whose session, not its process, ended (a
// partition, a PostgreSQL restart) may still publish what it holds:
// another relay may then publish the same events, a duplicate, never a
// loss. Its own instances, past and present, a store never rescues: it
// settles those claims itself.
//
// The rows of this relay's claims whose outcome it does not know. A claim
// statement that failed after it may have reached the server (neither the
// server's error, which rolled it back, nor an error pgx knows came before
// anything was sent) may have committed, and its rows are leased to a
// claim nobody holds. MarkAndClaim records its lease; ReleaseLost, once
// Probe shows that the database answers again, gives those rows back by
// their lease, as Release would.
//
// Neither reads the pending index from its head: only from the floor on,
// and the parked rows through the primary key.

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outboxrelay/outboxrelay/internal/lockkey"
)

// Rescue tuning.
const (
	// RescueEvery is how often Rescue looks at the instances of the rows
	// it knows to be leased by other relays: a relay that watches such
	// rows calls it at least this often, idle or not.
	RescueEvery = time.Second
	// ProbeTimeout bounds Probe: after a failed claim a pooled connection
	// may be dead without pgx knowing yet, and a statement on it would
	// wait for its whole timeout.
	ProbeTimeout = time.Second
	// maxLost bounds the claims of unknown outcome remembered; the rows of
	// one beyond it wait for their lease.
	maxLost = 1024
	// maxWatched bounds the rows known to be leased by other relays.
	maxWatched = maxParked
)

// Holder returns the relay instance whose claim the lease is, and false
// for a lease that names none: one made while its relay held no instance
// lock, or by an earlier version (a version 4 UUID, all random).
func (l LeaseID) Holder() (uint32, bool) {
	if l[6]>>4 != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint32(l[:4]), true
}

// holderOf is Holder for a lease as PostgreSQL writes it as text.
func holderOf(lease string) (uint32, bool) {
	// xxxxxxxx-xxxx-Vxxx-…: V, the version, is the 15th character.
	if len(lease) < 15 || lease[14] != '8' {
		return 0, false
	}
	id, err := strconv.ParseUint(lease[:8], 16, 32)
	if err != nil {
		return 0, false
	}
	return uint32(id), true
}

// newLease draws the lease of a claim: a version 8 UUID that carries the
// instance the relay holds now (Config.Instance) in its first 4 bytes, or,
// while it holds none, a random version 4 UUID. Both keep the RFC 9562
// variant.
func (s *Store) newLease() (LeaseID, error) {
	var lease LeaseID
	if _, err := crand.Read(lease[:]); err != nil {
		return lease, fmt.Errorf("lease id: %w", err)
	}
	lease[8] = lease[8]&0x3f | 0x80 // RFC 9562 variant
	var id uint32
	if s.cfg.Instance != nil {
		id = s.cfg.Instance()
	}
	if id == 0 {
		lease[6] = lease[6]&0x0f | 0x40 // version 4: random, no instance
		return lease, nil
	}
	binary.BigEndian.PutUint32(lease[:4], id)
	lease[6] = lease[6]&0x0f | 0x80 // version 8: the instance, then random
	s.rescue.stamped(id)
	return lease, nil
}

// heldRow is a row seen leased by another relay's instance.
type heldRow struct {
	holder uint32 // the instance
	seq    int64  // its relay_seq, against the floor
}

// rescuer is the store's knowledge of rows other relays hold, and of its
// own claims whose outcome it does not know.
type rescuer struct {
	last atomic.Uint32 // the instance the latest lease carried

	mu      sync.Mutex
	own     map[uint32]bool      // every instance this store stamped on a lease
	watched map[int64]heldRow    // rows seen leased by other instances, by id
	checked map[uint32]bool      // instances among watched's looked at by the last round
	fresh   bool                 // watched gained an instance not yet looked at
	lastRun time.Time            // when the last round ran
	lost    map[LeaseID]struct{} // claims whose outcome is unknown
}

// stamped records that a lease carried instance id.
func (r *rescuer) stamped(id uint32) {
	if r.last.Load() == id {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.own == nil {
		r.own = map[uint32]bool{}
	}
	r.own[id] = true
	r.last.Store(id)
}

// noteHeads watches the heads an advance read that are leased, not due,
// under another relay's instance.
func (s *Store) noteHeads(heads []head) {
	r := &s.rescue
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, h := range heads {
		if !h.lease.Valid || h.dueMS <= 0 {
			continue
		}
		id, ok := holderOf(h.lease.String)
		if !ok || r.own[id] {
			continue
		}
		if _, seen := r.watched[h.id]; !seen && len(r.watched) >= maxWatched {
			continue
		}
		if r.watched == nil {
			r.watched = map[int64]heldRow{}
		}
		r.watched[h.id] = heldRow{holder: id, seq: h.seq}
		if !r.checked[id] {
			r.fresh = true
		}
	}
}

// Watching reports whether the store knows of rows leased by other
// relays' instances, which Rescue looks at every RescueEvery.
func (s *Store) Watching() bool {
	s.rescue.mu.Lock()
	defer s.rescue.mu.Unlock()
	return len(s.rescue.watched) > 0
}

// due reports whether a rescue round is due: at once for an instance not
// yet looked at, and every RescueEvery while rows are watched.
func (r *rescuer) due(now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.watched) > 0 && (r.fresh || now.Sub(r.lastRun) >= RescueEvery)
}

// next returns the rows a rescue round looks at and this store's own
// instances, and starts the round. It first forgets the watched rows the
// floor has passed without parking them: they are settled.
func (r *rescuer) next(now time.Time, floor int64, parked []int64) (ids, own []int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	isParked := make(map[int64]bool, len(parked))
	for _, id := range parked {
		isParked[id] = true
	}
	r.checked = map[uint32]bool{}
	for id, w := range r.watched {
		if w.seq <= floor && !isParked[id] {
			delete(r.watched, id)
			continue
		}
		ids = append(ids, id)
		r.checked[w.holder] = true
	}
	for id := range r.own {
		own = append(own, int64(id))
	}
	r.fresh, r.lastRun = false, now
	return ids, own
}

// forget stops watching rows that were rescued.
func (r *rescuer) forget(ids []int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range ids {
		delete(r.watched, id)
	}
}

// Rescue makes the rows of relays that died claimable now, rather than
// when their lease expires: of the rows Advance saw leased by other
// relays' instances, those whose instance lock no session holds, and then
// every row of those instances above the floor and among the parked
// ones. It runs a round at once for an instance it has not looked at
// before and then every RescueEvery while it watches rows; between rounds
// it returns at once. It returns how many rows it made due.
func (s *Store) Rescue(ctx context.Context) (int64, error) {
	if !s.rescue.due(s.now()) {
		return 0, nil
	}
	floor, parked := s.floorAndParked()
	ids, own := s.rescue.next(s.now(), floor, parked)
	if len(ids) == 0 {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout+clientGrace)
	defer cancel()
	class := int32(lockkey.Relay)
	rows, err := s.db.Query(ctx, s.q.rescueHeld, ids, own, class)
	type held struct{ id, holder int64 }
	var found []held
	if err == nil {
		found, err = pgx.CollectRows(rows, func(cr pgx.CollectableRow) (h held, err error) {
			return h, cr.Scan(&h.id, &h.holder)
		})
	}
	if err != nil {
		return 0, fmt.Errorf("rescue: %w", err)
	}
	if len(found) == 0 {
		return 0, nil
	}
	due := make([]int64, 0, len(found))
	dead := map[int64]bool{}
	for _, h := range found {
		due = append(due, h.id)
		dead[h.holder] = true
	}
	s.rescue.forget(due)
	defer func() { s.dueNow(due) }()
	rows, err = s.db.Query(ctx, s.q.rescueInstances, floor, parked, slices.Collect(maps.Keys(dead)), class)
	var more []int64
	if err == nil {
		more, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	}
	if err != nil {
		return int64(len(due)), fmt.Errorf("rescue the rows of dead instances: %w", err)
	}
	s.rescue.forget(more)
	due = append(due, more...)
	return int64(len(due)), nil
}

// dueNow makes parked rows due now: rescued, or released.
func (s *Store) dueNow(ids []int64) {
	s.floor.mu.Lock()
	defer s.floor.mu.Unlock()
	now := s.now()
	for _, id := range ids {
		if p, ok := s.floor.parked[id]; ok {
			p.due = now
			s.floor.parked[id] = p
		}
	}
}

// noteLost records the lease of a claim that failed with err, if the
// claim may have been carried out all the same.
func (s *Store) noteLost(lease LeaseID, err error) {
	if !outcomeUnknown(err) {
		return
	}
	r := &s.rescue
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.lost) >= maxLost {
		return
	}
	if r.lost == nil {
		r.lost = map[LeaseID]struct{}{}
	}
	r.lost[lease] = struct{}{}
}

// outcomeUnknown reports whether a statement that failed with err may
// have been carried out: err is neither the server's (*pgconn.PgError: the
// statement, and its implicit transaction, were rolled back) nor one that
// pgx knows came before anything was sent (pgconn.SafeToRetry).
func outcomeUnknown(err error) bool {
	var pgErr *pgconn.PgError
	return err != nil && !errors.As(err, &pgErr) && !pgconn.SafeToRetry(err)
}

// Probe proves that the database answers, with a statement of its own
// within ProbeTimeout: after a claim failed without the server's answer, a
// statement with the store's whole timeout could wait on a dead
// connection for all of it.
func (s *Store) Probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	if _, err := s.db.Exec(ctx, s.q.probe); err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	return nil
}

// ReleaseLost gives back the rows of the claims whose outcome is unknown
// (see MarkAndClaim), by their lease: they are due at once, their attempt
// not counted. It returns how many rows it gave back; after an error the
// claims stay recorded for the next call. Call it once Probe has shown
// that the database answers.
func (s *Store) ReleaseLost(ctx context.Context) (int64, error) {
	s.rescue.mu.Lock()
	leases := slices.Collect(maps.Keys(s.rescue.lost))
	s.rescue.mu.Unlock()
	if len(leases) == 0 {
		return 0, nil
	}
	uuids := make([]pgtype.UUID, len(leases))
	for i, l := range leases {
		uuids[i] = pgtype.UUID{Bytes: l, Valid: true}
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout+clientGrace)
	defer cancel()
	floor, parked := s.floorAndParked()
	rows, err := s.db.Query(ctx, s.q.releaseLeases, uuids, floor, parked)
	var ids []int64
	if err == nil {
		ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	}
	if err != nil {
		return 0, fmt.Errorf("release lost claims: %w", err)
	}
	s.rescue.mu.Lock()
	for _, l := range leases {
		delete(s.rescue.lost, l)
	}
	s.rescue.mu.Unlock()
	s.dueNow(ids)
	return int64(len(ids)), nil
}
