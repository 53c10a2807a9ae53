package claim

// The floor keeps claims off the dead rows a long transaction leaves behind.
//
// A claim walks the pending index in insert order, by the seq column. Every
// row a relay publishes leaves its pending version's index entry behind,
// and vacuum cannot remove those entries while any transaction's snapshot
// may still see the row: a pg_dump, a report, a session idle in
// transaction, a standby's query under hot_standby_feedback. A claim from
// the head of the index walks every one of them, so its cost grows with
// every event published since that transaction began. Claims therefore
// start above a floor, a seq value: every row at or below it is settled
// (published, dead-lettered or deleted), or parked.
//
// The floor never passes the frontier, the highest seq no open transaction
// can still commit. The seq column is the relay's, not the application's:
// its default draws from a sequence of cache 1 (Check proves both), so
// every row's seq is taken by the INSERT that writes it, whatever the
// application does with its ids (hands them out in blocks, takes them
// before the insert, chooses them). nextval locks the sequence (ROW
// EXCLUSIVE) before it hands out a value and keeps the lock to its
// transaction's end. So the frontier moves to the sequence's last value,
// read first, once every transaction that held that lock when it was read
// has ended: the inserts, and no other writer (a Cancel's DELETE, a
// SELECT ... FOR UPDATE, a relay's own claims do not hold it back).
// A transaction that inserts and commits minutes later holds the frontier,
// and with it the floor, below its seq until it does: its event is claimed
// as soon as it is committed, however many later ones went first.
//
// Advance moves the floor up to the first pending row above it that a
// claim may take, or that has not yet been pending for long. A row that
// stays not due is parked and passed: a row backing off after a failed
// publish at once, a leased one once its lease has held the floor for
// parkAfter (its relay is slow, or died) or once it has lapsed, whichever
// comes first. The store remembers parked rows, by id, with the time each
// falls due, and claims them by id, through the primary key, when it does;
// a row it finds settled is forgotten.
//
// A pending row above the floor that the floor cannot park, because it lies
// above the frontier or is due already, is watched instead: the store
// remembers when it falls due, so that the relay wakes for it as for a
// parked row, and, in unordered mode, a due one a claim could not take
// (another transaction holds it: a Cancel not yet committed, a SELECT ...
// FOR UPDATE) is looked at again every parkRecheck until a claim takes it
// or it is gone. Without it such a row waits for a claim that something
// else brings: a transaction that only deletes from the table (a Cancel)
// holds the frontier as an inserting one does.
//
// Rows that become pending again below the floor by other means (requeued
// dead letters, rows reset by hand) are found by the sweep, which walks the
// whole of the pending index below the floor, a bounded range at a time:
// Rescan starts one, and so does every SweepInterval.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Floor tuning.
const (
	// advanceRows is how many pending rows above the floor one advance
	// looks at.
	advanceRows = 256
	// parkAfter is how long a leased row may hold the floor before it is
	// parked: a live relay settles its batches in milliseconds.
	parkAfter = time.Second
	// sweepSpan is the seq range one step of a sweep walks.
	sweepSpan = 50000
	// maxParked bounds the parked rows remembered; a row beyond it keeps
	// the floor below it.
	maxParked = 100000
)

// parkedRow is a row below the floor that was pending when last read.
type parkedRow struct {
	due time.Time // when it falls due, by the store's clock
	key string    // its aggregate (ordered claims); "" otherwise
}

// floor is the store's floor, frontier and parked rows.
type floor struct {
	at atomic.Int64 // claims start above it

	mu       sync.Mutex // Advance, and everything below
	off      bool       // no frontier can be had: claims start at the head
	frontier int64
	raised   int64    // the frontier the floor was last raised up to
	round    struct { // the frontier's move in progress
		active  bool
		last    int64    // the sequence's last value when it began
		writers []string // the transactions inserting then, not yet ended
	}
	parked    map[int64]parkedRow
	watched   map[int64]time.Time  // rows above the floor Advance could not park → when to claim (watch)
	leases    map[string]time.Time // lease → when it was first seen holding the floor
	sweep     int64                // where the sweep has walked to
	sweepTo   int64                // where it stops; 0 when none runs
	lastSweep time.Time            // when the last sweep began
	lastCheck time.Time            // when the parked rows were last reread
	held      bool                 // a leased row holds the floor, not yet parked
}

// Floor reports where claims start: every row at or below it is settled or
// parked.
func (s *Store) Floor() int64 { return s.floor.at.Load() }

// Parked reports how many rows below the floor are parked.
func (s *Store) Parked() int {
	s.floor.mu.Lock()
	defer s.floor.mu.Unlock()
	return len(s.floor.parked)
}

// ParkedDue returns how long until the earliest parked or watched row
// falls due (or is to be looked at again), and false if there is none.
func (s *Store) ParkedDue() (time.Duration, bool) {
	s.floor.mu.Lock()
	defer s.floor.mu.Unlock()
	if len(s.floor.parked) == 0 && len(s.floor.watched) == 0 {
		return 0, false
	}
	var first time.Time
	for _, p := range s.floor.parked {
		if first.IsZero() || p.due.Before(first) {
			first = p.due
		}
	}
	for _, due := range s.floor.watched {
		if first.IsZero() || due.Before(first) {
			first = due
		}
	}
	return max(first.Sub(s.now()), 0), true
}

// floorAndParked returns the floor and the parked rows' ids, read
// together.
func (s *Store) floorAndParked() (int64, []int64) {
	s.floor.mu.Lock()
	defer s.floor.mu.Unlock()
	return s.floor.at.Load(), slices.Collect(maps.Keys(s.floor.parked))
}

// orderedParked returns the floor and every parked row's id, due or not,
// for an ordered claim (a parked row not due holds its aggregate). As
// dueParked does for an unordered claim, it has the rows due now looked at
// again only in parkRecheck: a claim that cannot take one (another
// transaction holds it, it is in flight, its aggregate waits) would
// otherwise be woken for it again at once, and again.
func (s *Store) orderedParked() (int64, []int64) {
	s.floor.mu.Lock()
	defer s.floor.mu.Unlock()
	now := s.now()
	ids := make([]int64, 0, len(s.floor.parked))
	for id, p := range s.floor.parked {
		if !p.due.After(now) {
			p.due = now.Add(parkRecheck)
			s.floor.parked[id] = p
		}
		ids = append(ids, id)
	}
	return s.floor.at.Load(), ids
}

// Unsettled reports whether Advance has work left that no claim brings
// and that cannot wait: a sweep under way, a frontier move to finish, a
// floor not yet raised to the frontier (it follows one advance behind), a
// leased row holding the floor until it is parked. Parked rows alone are
// not: Advance rereads them at most every ParkedRereadEvery, and ParkedDue
// says when the first falls due.
func (s *Store) Unsettled() bool {
	s.floor.mu.Lock()
	defer s.floor.mu.Unlock()
	return s.floor.sweepTo > 0 || s.floor.round.active || s.floor.raised < s.floor.frontier || s.floor.held
}

// Rescan starts a sweep of the pending index below the floor, for rows
// that became pending there by other means than a relay's own (requeued
// dead letters, rows reset by hand); Advance takes it a step at a time.
func (s *Store) Rescan() {
	s.floor.mu.Lock()
	defer s.floor.mu.Unlock()
	s.startSweep()
}

// startSweep begins a sweep up to the floor. Called with mu held.
func (s *Store) startSweep() {
	s.floor.sweep, s.floor.sweepTo = 0, s.floor.at.Load()
	s.floor.lastSweep = s.now()
}

// dueParked returns the parked rows due now, at most limit, for a claim.
// The watched rows due now are the claim's to take above the floor: until
// an advance or a claim says otherwise, they too are looked at again in
// parkRecheck.
func (s *Store) dueParked(limit int) []int64 {
	s.floor.mu.Lock()
	defer s.floor.mu.Unlock()
	now := s.now()
	for id, due := range s.floor.watched {
		if !due.After(now) {
			s.floor.watched[id] = now.Add(parkRecheck)
		}
	}
	if len(s.floor.parked) == 0 {
		return nil
	}
	var ids []int64
	for id, p := range s.floor.parked {
		if !p.due.After(now) {
			ids = append(ids, id)
			// Until a claim or a check says otherwise, look again in a
			// while, not at every claim (it may be leased elsewhere).
			p.due = now.Add(parkRecheck)
			s.floor.parked[id] = p
			if len(ids) == limit {
				break
			}
		}
	}
	return ids
}

// parkRecheck is how soon a parked or watched row that was due but not
// claimed is looked at again: another transaction may hold it (a Cancel or
// a SELECT ... FOR UPDATE not yet ended, another relay's claim), or its
// time may not have come by the database's clock. It bounds how late such
// a row goes out after what held it ends; a claim every parkRecheck is
// what a row held past its time costs, for as long as it is held.
const parkRecheck = 25 * time.Millisecond

// ParkedRereadEvery is how often Advance rereads the parked rows, to
// forget those settled by another relay and to learn the new due times of
// those put back (retried, released): a relay with parked rows and nothing
// else to do calls Advance this often.
const ParkedRereadEvery = time.Second

// unpark forgets parked rows a claim took. In ordered mode it keeps them:
// a row in flight below the floor heads its aggregate as a parked one does,
// and holds it back from the store's other claims until it settles (the
// reread of the parked rows forgets it then).
// The watched rows a claim took are forgotten in either mode.
func (s *Store) unpark(events []Event) {
	s.floor.mu.Lock()
	defer s.floor.mu.Unlock()
	if len(s.floor.watched) > 0 {
		for _, e := range events {
			delete(s.floor.watched, e.ID)
		}
	}
	if s.floor.at.Load() == 0 || s.cfg.Ordering == OrderAggregate {
		return
	}
	for _, e := range events {
		delete(s.floor.parked, e.ID)
	}
}

// putBack is a row a retry or a release made pending again.
type putBack struct {
	id, seq int64
	due     time.Duration // until it is due
}

// park remembers rows put back below the floor (retried, or released) and
// when they fall due.
func (s *Store) park(rows []putBack) {
	floor := s.floor.at.Load()
	if floor == 0 {
		return
	}
	s.floor.mu.Lock()
	defer s.floor.mu.Unlock()
	now := s.now()
	for _, r := range rows {
		if r.seq > floor {
			continue
		}
		if s.floor.parked == nil {
			s.floor.parked = map[int64]parkedRow{}
		}
		s.floor.parked[r.id] = parkedRow{due: now.Add(r.due)}
	}
}

// ErrNoFrontier is Advance's error when the frontier cannot be had: the seq
// column owns no sequence, or the role may not read it (see LastInsertID).
// Claims then walk the pending index from its head, as they must.
var ErrNoFrontier = errors.New("no frontier")

// Advance moves the frontier and the floor as far as they may go, and
// takes a step of a sweep if one runs. One call runs at a time; a call
// made while another runs returns at once. A relay calls it a few times a
// second while it claims.
//
// Its one statement reads the sequence, then the table's inserters (the
// transactions that drew from it and have not ended), and the
// first pending rows above the floor. Those rows are read with the
// statement's snapshot, taken before the writers were: the floor may pass
// them only up to the frontier known before the statement began, whose
// writers had all ended by then. So the floor follows the frontier one
// advance behind.
func (s *Store) Advance(ctx context.Context) error {
	f := &s.floor
	if !f.mu.TryLock() {
		return nil
	}
	defer f.mu.Unlock()
	if f.off {
		return ErrNoFrontier
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout+clientGrace)
	defer cancel()
	r, err := s.advanceRound(ctx)
	if err != nil {
		if errors.Is(err, ErrInsertsUnreadable) {
			f.off = true
			f.at.Store(0)
			return fmt.Errorf("advance: %w: %w", ErrNoFrontier, err)
		}
		return fmt.Errorf("advance: %w", err)
	}
	s.noteHeads(r.heads) // rescue.go
	known, heads := f.frontier, r.heads
	if f.moveFrontier(r.last, r.writers) {
		known, heads = 0, nil // the sequence went back: the rows read are of no use
	}
	if s.now().Sub(f.lastCheck) >= ParkedRereadEvery {
		if err := s.checkParked(ctx); err != nil {
			return fmt.Errorf("advance: %w", err)
		}
		f.lastCheck = s.now()
	}
	s.raiseFloor(heads, known)
	s.watch(heads)
	if f.sweepTo == 0 && s.cfg.SweepInterval > 0 && s.now().Sub(f.lastSweep) >= s.cfg.SweepInterval {
		s.startSweep()
	}
	if err := s.sweepStep(ctx); err != nil {
		return fmt.Errorf("advance: sweep: %w", err)
	}
	return nil
}

// head is a pending row above the floor, as an advance reads it.
type head struct {
	seq   int64
	id    int64
	lease pgtype.Text
	dueMS float64 // until it is due; 0 or less: due now
	key   pgtype.Text
}

// round is what one advance's statement read.
type round struct {
	last    int64    // the sequence's last value
	writers []string // the transactions that drew from the sequence and had not ended, read after it
	heads   []head   // the first pending rows above the floor in seq order, if below the frontier known
}

// advanceRound runs the advance's statement.
func (s *Store) advanceRound(ctx context.Context) (round, error) {
	seq, err := s.insertSequence(ctx)
	if err != nil {
		return round{}, err
	}
	var r round
	var seqs, ids []int64
	var leases, keys []pgtype.Text
	var due []float64
	// The rows above the floor are read while the floor is below the
	// frontier known, and while a move of the frontier waits for a
	// writer: the floor may not pass the rows it covers then, but they
	// are watched (watch).
	upTo := s.floor.frontier
	if s.floor.round.active {
		upTo = s.floor.round.last
	}
	rows, err := s.db.Query(ctx, s.q.advance, seq, s.floor.at.Load(), upTo, advanceRows)
	if err == nil {
		_, err = pgx.CollectExactlyOneRow(rows, func(cr pgx.CollectableRow) (struct{}, error) {
			return struct{}{}, cr.Scan(&r.last, &r.writers, &seqs, &ids, &leases, &due, &keys)
		})
	}
	if err != nil {
		return round{}, sequenceError(err, seq)
	}
	if len(ids) != len(seqs) || len(leases) != len(seqs) || len(due) != len(seqs) || len(keys) != len(seqs) {
		return round{}, fmt.Errorf("advance: %d seqs, %d ids, %d leases, %d due times, %d keys", len(seqs), len(ids), len(leases), len(due), len(keys))
	}
	r.heads = make([]head, len(seqs))
	for i, sq := range seqs {
		r.heads[i] = head{seq: sq, id: ids[i], lease: leases[i], dueMS: due[i], key: keys[i]}
	}
	return r, nil
}

// moveFrontier ends the frontier's move in progress if its writers have
// all ended, and begins the next one: last is the sequence's last value,
// writing the transactions that had drawn from it and not ended, read
// after it. It reports
// whether the sequence went back (restarted): values at or below the floor
// are handed out again, and the floor starts over.
func (f *floor) moveFrontier(last int64, writing []string) (reset bool) {
	if f.round.active {
		// A writer of the round still writing is among those writing now.
		left := slices.DeleteFunc(f.round.writers, func(w string) bool { return !slices.Contains(writing, w) })
		if len(left) > 0 {
			f.round.writers = left
			return false
		}
		f.frontier, f.round.active = f.round.last, false
	}
	if last == f.frontier {
		return false // no value handed out since: the frontier is where it can be
	}
	if last < f.frontier {
		f.frontier = 0
		f.at.Store(0)
		clear(f.parked)
		reset = true
	}
	// The sequence was read first: a transaction that took a value up to
	// last held the sequence's lock already when the writers were read, or
	// had ended.
	if len(writing) == 0 {
		f.frontier = last
		return reset
	}
	f.round.active, f.round.last, f.round.writers = true, last, writing
	return reset
}

// raiseFloor moves the floor past the settled rows above it and the
// pending rows it parks, up to known: heads are the first pending rows
// above the floor, read when every transaction that could commit a seq up
// to known had ended.
func (s *Store) raiseFloor(heads []head, known int64) {
	// Floor, frontier and heads are seq values; parked rows are kept by id.
	f := &s.floor
	f.raised = known
	at := f.at.Load()
	if at >= known {
		return
	}
	now := s.now()
	seen := map[string]time.Time{}
	// With nothing pending up to the frontier, the floor goes there; a row
	// that stops it keeps the floor just below it.
	to, stopped := known, false
	f.held = false
	for _, h := range heads {
		if h.seq > known {
			stopped = true
			break
		}
		park := false
		switch {
		case h.dueMS <= 0 && h.lease.Valid:
			// Its lease lapsed before it was parked: its relay died, or
			// failed to renew it. Nothing announces a lapse (no insert, no
			// notification), and the relay may have claimed all else:
			// parked, due now, it wakes the relay (ParkedDue) and is
			// claimed by id.
			park = true
		case h.dueMS <= 0:
			// Claimable: a claim takes it.
		case !h.lease.Valid:
			park = true // backing off after a failed publish, or scheduled
		default:
			first, ok := f.leases[h.lease.String]
			if !ok {
				first = now
			}
			seen[h.lease.String] = first
			park = now.Sub(first) >= parkAfter
		}
		if !park || len(f.parked) >= maxParked {
			to, stopped = h.seq-1, true
			// A leased row holds the floor until it is parked: Advance
			// has work left, which no claim may bring (its relay may be
			// gone, and nothing else due).
			f.held = h.lease.Valid && h.dueMS > 0
			break
		}
		if f.parked == nil {
			f.parked = map[int64]parkedRow{}
		}
		f.parked[h.id] = parkedRow{due: now.Add(time.Duration(h.dueMS * float64(time.Millisecond))), key: h.key.String}
	}
	if !stopped && len(heads) == advanceRows {
		to = heads[len(heads)-1].seq // every row looked at was parked: more may follow
	}
	f.leases = seen
	if to > at {
		f.at.Store(to)
	}
}

// watch remembers, of heads, the pending rows above the floor that no
// lease holds, with when each falls due, for ParkedDue: the floor parks no
// row above the frontier and stops below a row due now, and nothing else
// would wake the relay for them. A row a claim looked at since it fell due
// keeps the time dueParked gave it. In ordered mode only rows not yet due
// are watched: a due row a claim did not take may wait for its aggregate,
// and what unblocks an aggregate wakes the relay itself. Called with mu
// held, after raiseFloor.
func (s *Store) watch(heads []head) {
	f := &s.floor
	at := f.at.Load()
	now := s.now()
	var watched map[int64]time.Time
	for _, h := range heads {
		if h.seq <= at || h.lease.Valid || (h.dueMS <= 0 && s.cfg.Ordering == OrderAggregate) {
			continue
		}
		due := now.Add(time.Duration(max(h.dueMS, 0) * float64(time.Millisecond)))
		if next, ok := f.watched[h.id]; ok && next.After(due) {
			due = next
		}
		if watched == nil {
			watched = map[int64]time.Time{}
		}
		watched[h.id] = due
	}
	f.watched = watched
}

// checkParked rereads the parked rows: one settled (or gone) is forgotten,
// one put back (retried, released) gets its new due time.
func (s *Store) checkParked(ctx context.Context) error {
	f := &s.floor
	if len(f.parked) == 0 {
		return nil
	}
	ids := slices.Collect(maps.Keys(f.parked))
	rows, err := s.db.Query(ctx, s.q.parked, ids)
	if err != nil {
		return err
	}
	type row struct {
		id    int64
		dueMS float64
	}
	pending, err := pgx.CollectRows(rows, func(cr pgx.CollectableRow) (r row, err error) {
		return r, cr.Scan(&r.id, &r.dueMS)
	})
	if err != nil {
		return err
	}
	now := s.now()
	kept := make(map[int64]parkedRow, len(pending))
	for _, r := range pending {
		p := f.parked[r.id]
		p.due = now.Add(time.Duration(max(r.dueMS, 0) * float64(time.Millisecond)))
		kept[r.id] = p
	}
	f.parked = kept
	return nil
}

// sweepStep walks the next range of the pending index below the floor and
// parks what it finds pending there.
func (s *Store) sweepStep(ctx context.Context) error {
	f := &s.floor
	if f.sweepTo == 0 {
		return nil // none runs
	}
	to := min(f.sweep+sweepSpan, f.sweepTo)
	rows, err := s.db.Query(ctx, s.q.sweep, f.sweep, to)
	if err != nil {
		return err
	}
	type row struct {
		id    int64
		dueMS float64
		key   pgtype.Text
	}
	found, err := pgx.CollectRows(rows, func(cr pgx.CollectableRow) (r row, err error) {
		return r, cr.Scan(&r.id, &r.dueMS, &r.key)
	})
	if err != nil {
		return err
	}
	now := s.now()
	for _, r := range found {
		if f.parked == nil {
			f.parked = map[int64]parkedRow{}
		}
		if len(f.parked) < maxParked {
			f.parked[r.id] = parkedRow{due: now.Add(time.Duration(max(r.dueMS, 0) * float64(time.Millisecond))), key: r.key.String}
		}
	}
	f.sweep = to
	if f.sweep >= f.sweepTo {
		f.sweep, f.sweepTo = 0, 0
	}
	return nil
}
