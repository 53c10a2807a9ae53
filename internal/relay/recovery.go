package relay

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Recovery frees rows that claims hold but no relay will settle, sooner
// than their lease; *claim.Store has it (see claim.Store.Rescue).
type Recovery interface {
	// Rescue makes the rows of relays that died claimable now; it runs a
	// round only when one is due and returns how many rows it freed. The
	// relay calls it after every advance of the Floor.
	Rescue(ctx context.Context) (int64, error)
	// Watching reports whether rows leased by other relays are known, for
	// Rescue to look at: the relay then advances at least every
	// claim.RescueEvery, idle or not.
	Watching() bool
	// Probe proves that the database answers, within a short bound.
	Probe(ctx context.Context) error
	// ReleaseLost gives back the rows of this relay's claims whose
	// outcome is unknown, and returns how many.
	ReleaseLost(ctx context.Context) (int64, error)
}

// RecoverEvery is how often the relay probes a database that failed a
// claim without answering, until it answers.
const RecoverEvery = 500 * time.Millisecond

// dbState is whether the database answers, as the claims find it: a claim
// that fails without the server's answer (a timeout, a broken connection)
// marks it down, and the recover loop marks it up once a probe answers.
// While it is down the workers do not claim: a claim sent then would wait
// its whole timeout on a connection that may be dead, and the workers
// doing so would still be waiting long after the database came back.
type dbState struct {
	mu   sync.Mutex
	up   chan struct{} // closed while the database answers
	kick chan struct{} // wakes the recover loop
}

func newDBState() dbState {
	up := make(chan struct{})
	close(up)
	return dbState{up: up, kick: make(chan struct{}, 1)}
}

// down records that the database did not answer a claim, and wakes the
// recover loop.
func (d *dbState) down() {
	d.mu.Lock()
	select {
	case <-d.up:
		d.up = make(chan struct{})
	default: // down already
	}
	d.mu.Unlock()
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// markUp records that the database answers.
func (d *dbState) markUp() {
	d.mu.Lock()
	defer d.mu.Unlock()
	select {
	case <-d.up:
	default:
		close(d.up)
	}
}

// wait returns once the database answers, or with ctx's error.
func (d *dbState) wait(ctx context.Context) error {
	d.mu.Lock()
	up := d.up
	d.mu.Unlock()
	select {
	case <-up:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// answered reports whether err is the server's answer (the statement was
// refused or failed there), rather than a timeout or a broken connection.
func answered(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr)
}

// claimFailed handles a claim that failed with err, carrying the marks of
// batches: if the server answered, the marks are made on their own, as
// the claim would have; if it did not, the database is marked down (the
// recover loop probes it and releases what the claim may have left
// leased) and the marks go back to the queue, for the mark loop or the next
// claim to make, so that no worker waits on them while the database is
// away.
func (r *Relay) claimFailed(drainCtx context.Context, err error, batches []confirmed) {
	if r.cfg.Recovery == nil || answered(err) {
		r.settle(drainCtx, batches)
		return
	}
	r.db.down()
	if r.marks.putBack(batches) {
		select {
		case r.marks.kick <- struct{}{}:
		default:
		}
	}
}

// recover runs while the relay has a Recovery: each time a claim marks the
// database down, it probes the database every RecoverEvery until it
// answers (Recovery.Probe) and lets the workers claim again, waking one if
// the database was away; then it gives back the rows of the claims whose
// outcome is unknown (Recovery.ReleaseLost), again every RecoverEvery
// until that succeeds, and wakes a worker to claim them.
func (r *Relay) recover(ctx context.Context) {
	rec := r.cfg.Recovery
	retry := func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-r.cfg.Clock.After(RecoverEvery):
			return true
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.db.kick:
		}
		away := false
		for {
			err := rec.Probe(ctx)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return
			}
			if !away {
				r.log.Warn("database not answering; claims wait for it", "err", err)
			}
			away = true
			if !retry() {
				return
			}
		}
		r.db.markUp()
		if away {
			r.log.Info("database answers again; claiming")
			r.poke()
		}
		for {
			n, err := rec.ReleaseLost(ctx)
			if err == nil {
				if n > 0 {
					r.stats.released.Add(n)
					r.obs.Released(int(n))
					r.log.Info("released the events of claims whose outcome was lost", "events", n)
					r.poke()
				}
				break
			}
			if ctx.Err() != nil {
				return
			}
			r.log.Warn("releasing the events of claims whose outcome was lost failed; retrying", "err", err)
			if !retry() {
				return
			}
		}
	}
}

// rescue frees the rows of relays that died, after an advance (see
// Recovery.Rescue), and wakes a worker to claim them.
func (r *Relay) rescue(ctx context.Context) {
	if r.cfg.Recovery == nil {
		return
	}
	n, err := r.cfg.Recovery.Rescue(ctx)
	if err != nil && ctx.Err() == nil {
		r.log.Warn("taking over the events of relays that died failed", "err", err)
	}
	if n > 0 {
		r.log.Info("took over the events of relays that died", "events", n)
		r.poke()
	}
}

// watching reports whether rows leased by other relays are known.
func (r *Relay) watching() bool {
	return r.cfg.Recovery != nil && r.cfg.Recovery.Watching()
}
