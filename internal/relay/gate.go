package relay

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/pace"
)

// Gate switches the outbox trigger's notifications; *notify.Gate has it.
type Gate interface {
	// Open makes producers notify, then waits for every producer that may
	// have seen the gate closed to finish, so a claim after it returns sees
	// their events.
	Open(ctx context.Context) error
	// Close stops the notifications for TTL.
	Close(ctx context.Context) error
	// TTL is how long Close lasts.
	TTL() time.Duration
}

// Steering samples the insert rate this often, over rateWindow.
const (
	rateSampleEvery = 50 * time.Millisecond
	rateSamples     = 5 // rateWindow = (rateSamples-1) * rateSampleEvery
)

// gateTimeout bounds one gate statement; Open's wait for producers is
// bounded by the pool's statement timeout as well.
const gateTimeout = 15 * time.Second

// Inserts reads the producers' pace (*claim.Store has it).
type Inserts interface {
	// LastInsertID is the last value the sequence of the outbox's insert
	// order (claim.Event.Seq) handed out.
	LastInsertID(ctx context.Context) (int64, error)
	// NotifyWaiters is how many transactions wait to commit behind
	// PostgreSQL's NOTIFY lock, which serializes the commits of
	// transactions that sent NOTIFY.
	NotifyWaiters(ctx context.Context) (int, error)
}

// The gate also closes below BusyRate when producers queue on the NOTIFY
// lock: on a server whose WAL flush is slow, notifying producers cannot
// commit faster than one flush at a time, which may be below BusyRate, so
// the rate alone would never close the gate. It closes once the lock has
// had contendedWaiters waiters on average over the rate window while the
// rate is at least contendedMinRate (the lock is the server's, and other
// applications' NOTIFYs should not close the gate of a quiet outbox), and
// opens again below a quarter of the rate at which it closed.
const (
	contendedWaiters = 2
	contendedMinRate = 100
)

// insertsTimeout bounds one reading of Inserts: the gate's steering waits
// for it.
const insertsTimeout = time.Second

// IdleInsertsEvery is how often an open gate with nothing claimed reads the
// insert order's sequence: the interval within which an insert whose
// notification was lost is found while the relay is idle. Each reading is
// a round trip that wakes the relay and its backend, which is most of what
// an idle relay costs; a sample that sees the sequence move goes back to
// the busy pace.
// The readiness round runs on the same instants (cmd/outboxrelay), so an
// idle relay wakes once for both (decision 0007).
const IdleInsertsEvery = 2 * time.Second

// meter follows the highest insert order (claim.Event.Seq) claimed: it
// comes from the sequence Inserts reads, drawn once by every insert, so its
// growth is the table's insert rate, whichever relay claimed the rows.
// (Event.ID will not do: ids may be handed out in blocks, ahead of the
// insert, or chosen by the application.)
//
// While the steering rests (resting set), the first claim that moves the
// meter wakes it (wake): a burst after a quiet spell is measured from its
// first claim, not from the next idle sample up to IdleInsertsEvery later,
// and its producers stop paying for NOTIFY within a few rate samples.
type meter struct {
	maxID   atomic.Int64
	resting atomic.Bool
	wake    chan struct{}
}

// observe records a claimed row's insert order, and wakes the resting
// steering.
func (m *meter) observe(id int64) {
	for {
		cur := m.maxID.Load()
		if id <= cur {
			return
		}
		if m.maxID.CompareAndSwap(cur, id) {
			if m.resting.Load() && m.resting.CompareAndSwap(true, false) {
				select {
				case m.wake <- struct{}{}:
				default:
				}
			}
			return
		}
	}
}

type rateSample struct {
	at time.Time
	id int64
}

// rateRing keeps the last rateSamples samples.
type rateRing struct {
	s [rateSamples]rateSample
	n int
}

// add records a sample and returns the rate per second across the ring.
func (r *rateRing) add(s rateSample) float64 {
	r.s[r.n%rateSamples] = s
	r.n++
	if r.n < 2 {
		return 0
	}
	oldest := r.s[max(r.n-rateSamples, 0)%rateSamples]
	dt := s.at.Sub(oldest.at).Seconds()
	if dt <= 0 {
		return 0
	}
	return float64(s.id-oldest.id) / dt
}

// steer runs the gate. The relay starts with the gate open, waiting for
// notifications. When the insert rate passes BusyRate it closes the gate,
// so producers stop paying for NOTIFY, and claims every BusyPollInterval
// instead; it keeps the gate closed by refreshing it within its TTL. When
// the rate falls below BusyRate/2 it opens the gate and claims once more
// after Open has waited out the producers that saw it closed: an event is
// then either claimed by that pass or announced by a notification. The gap
// between the thresholds keeps a relay near the threshold from flapping.
//
// When producers queue on the NOTIFY lock (Inserts.NotifyWaiters, read at
// a sample after a claim while the gate is open and the rate is at least
// contendedMinRate), the gate closes below BusyRate too, and then opens
// below a quarter of the rate at which it closed.
//
// The rate is the growth of the highest insert order seen: that of the
// rows claimed and, with Config.Inserts, its sequence's last value, read at
// every sample while the gate is closed and, while it is open, at a sample
// after a claim and otherwise every IdleInsertsEvery. A relay that falls
// behind its producers therefore keeps the gate closed while they insert fast,
// instead of reading its own slowness as quiet and making every insert
// notify again; and an open gate whose notifications do not come (the
// trigger disabled or dropped, a notification lost) sees the sequence
// move: it wakes the workers when the sequence passed the rows claimed with
// nothing claimed since the last sample, and closes the gate if the
// producers are busy, rather than leaving their events to the fallback
// poll.
//
// At shutdown it opens the gate, for a second at most and no later than
// the shutdown deadline (drainCtx's end); *notify.Gate ends its lock's
// transaction first, on bounds of its own.
func (r *Relay) steer(ctx, drainCtx context.Context) {
	g := r.cfg.Gate
	open := true
	// opened is whether the last gate statement was an Open that
	// succeeded: a Close or Open cut short by shutdown may have set the
	// gate all the same, so anything else leaves it to reopen at shutdown.
	opened := r.openGate(ctx) == nil
	var (
		ring       rateRing
		lastSample time.Time
		lastClose  time.Time
		// claimed is the meter at the last sample; inserted the highest value
		// Inserts has reported; woken the highest value a claim was woken for
		// because the sequence showed it unclaimed.
		claimed, inserted, woken int64
		insertsOff               bool      // Inserts failed for good (no sequence)
		readInserts              bool      // Inserts has been read once
		nextRead                 time.Time // when an open, quiet gate reads Inserts next
		// waiters holds the NOTIFY lock's waiters at the last rateSamples
		// samples; openBelow is the rate under which a closed gate opens.
		waiters   [rateSamples]int
		openBelow = r.cfg.BusyRate / 2
	)
	requeues, _ := r.listener.(requeueSignals)
	var requeued uint64
	if requeues != nil {
		requeued = requeues.Requeues()
	}
	// quiet is whether the last sample, with the gate open, saw nothing
	// claimed and the sequence standing still: the relay is idle, and
	// samples on the wall clock's multiples of IdleInsertsEvery instead
	// of every rateSampleEvery until a sample sees either move. The rate
	// is the ring's growth over its samples' times, so the longer spacing
	// does not bias it.
	quiet := false
	// burst is set when a claim ended a rest, at burstFrom: the rate is
	// measured afresh from there, and from what had been inserted before,
	// a sample later (the quiet spell's samples would dilute it).
	var (
		burst     bool
		burstFrom rateSample
	)
	startBurst := func() {
		burst = true
		burstFrom = rateSample{at: r.cfg.Clock.Now(), id: max(claimed, inserted)}
	}
	for {
		wait := rateSampleEvery
		switch {
		case !open:
			wait = r.cfg.BusyPollInterval
		case burst:
			wait = burstFrom.at.Add(rateSampleEvery).Sub(r.cfg.Clock.Now())
		case quiet:
			// On the wall clock's multiples of IdleInsertsEvery, with the
			// readiness monitor's rounds (pace.Next): one wake-up for both.
			// A claim that takes rows meanwhile ends the rest (meter).
			now := r.cfg.Clock.Now()
			wait = pace.Next(now, IdleInsertsEvery).Sub(now)
			r.meter.resting.Store(true)
			if r.meter.maxID.Load() != claimed && r.meter.resting.CompareAndSwap(true, false) {
				startBurst() // claimed since the sample: no rest
				wait = rateSampleEvery
			}
		}
		select {
		case <-r.meter.wake:
			startBurst()
			continue
		case <-ctx.Done():
			if !opened {
				// Leave the gate open for the relays that stay. Open sets the
				// gate before it waits for producers, and a relay leaving
				// need not wait: a short deadline keeps shutdown bounded.
				stopCtx, cancel := context.WithTimeout(drainCtx, time.Second)
				r.openGate(stopCtx)
				cancel()
			}
			return
		case <-r.cfg.Clock.After(wait):
		}
		r.meter.resting.Store(false)
		select {
		case <-r.meter.wake: // a claim ended the rest as it ran out
			startBurst()
			continue
		default:
		}
		now := r.cfg.Clock.Now()
		if !open && !r.sparePoll() {
			r.poke()
		}
		if now.Sub(lastSample) < rateSampleEvery || burst && now.Sub(burstFrom.at) < rateSampleEvery {
			continue
		}
		lastSample = now
		if requeues != nil {
			if n := requeues.Requeues(); n != requeued {
				requeued = n
				r.kickAdvance() // an idle floor rescans for the requeued rows
			}
		}
		seen := r.meter.maxID.Load()
		active := seen != claimed // claimed something since the last sample
		before := inserted
		if r.cfg.Inserts != nil && !insertsOff && (!open || active || !now.Before(nextRead)) {
			nextRead = pace.Next(now, IdleInsertsEvery)
			id, err := r.lastInsert(ctx)
			switch {
			case errors.Is(err, claim.ErrInsertsUnreadable):
				insertsOff = true
				r.log.Info("the insert rate comes from claimed ids alone", "err", err)
			case err == nil && !readInserts:
				// The first reading is where the sequence stands, not how
				// fast it moves: rates start from it.
				readInserts, inserted, ring = true, id, rateRing{}
			case err == nil:
				inserted = max(inserted, id)
			}
			if err == nil && open && !active && id > max(seen, woken) {
				// Inserts beyond the rows claimed, and no claim since the
				// last sample: their notifications did not come (or not
				// yet). Claim, once for these ids.
				woken = id
				r.poke()
			}
		}
		if burst {
			ring = rateRing{}
			ring.add(burstFrom)
			burst = false
		}
		claimed = seen
		quiet = open && !active && inserted == before
		rate := ring.add(rateSample{at: now, id: max(seen, inserted)})
		waiting := 0
		if open && active && r.cfg.Inserts != nil && rate >= contendedMinRate {
			waiting = r.notifyWaiters(ctx)
		}
		waiters[ring.n%rateSamples] = waiting
		contended := sum(waiters[:]) >= contendedWaiters*rateSamples
		switch {
		case open && (rate > r.cfg.BusyRate || contended):
			opened = false
			if err := r.closeGate(ctx); err != nil {
				continue
			}
			open, lastClose = false, now
			openBelow = r.cfg.BusyRate / 2
			if rate <= r.cfg.BusyRate {
				// Closed by the waiters: the rate read at the close is
				// noisy (a sample without a claim reads no sequence), so
				// leave room below it.
				openBelow = min(openBelow, rate/4)
			}
			waiters = [rateSamples]int{}
			r.log.Debug("busy: gate closed, polling", "rate", int(rate), "notify_waiters", waiting)
		case !open && rate < openBelow:
			open = true
			opened = r.openGate(ctx) == nil
			r.log.Debug("idle: gate open, waiting for notifications", "rate", int(rate))
		case !open && now.Sub(lastClose) >= g.TTL()/4:
			if err := r.closeGate(ctx); err == nil {
				lastClose = now
			}
		}
	}
}

// sparePoll reports whether a busy poll would only walk an ordered table
// to find nothing (Config.Ordered): a worker is in flight, and will claim
// again once its batch settles, and the last claim found nothing beyond its
// batch.
func (r *Relay) sparePoll() bool {
	return r.cfg.Ordered && r.dry.Load() && r.inFlight.Load() > 0
}

// lastInsert reads Inserts; a failure is logged at debug level and leaves
// the rate to the rows claimed this time.
func (r *Relay) lastInsert(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, insertsTimeout)
	defer cancel()
	id, err := r.cfg.Inserts.LastInsertID(ctx)
	if err != nil && ctx.Err() == nil {
		r.log.Debug("reading the insert sequence failed", "err", err)
	}
	return id, err
}

// notifyWaiters reads Inserts.NotifyWaiters; a failure is logged at debug
// level and reads as none.
func (r *Relay) notifyWaiters(ctx context.Context) int {
	ctx, cancel := context.WithTimeout(ctx, insertsTimeout)
	defer cancel()
	n, err := r.cfg.Inserts.NotifyWaiters(ctx)
	if err != nil && ctx.Err() == nil {
		r.log.Debug("reading the NOTIFY lock's waiters failed", "err", err)
	}
	return n
}

func sum(xs []int) (n int) {
	for _, x := range xs {
		n += x
	}
	return n
}

func (r *Relay) closeGate(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, gateTimeout)
	defer cancel()
	err := r.cfg.Gate.Close(ctx)
	if err != nil && ctx.Err() == nil {
		r.log.Warn("closing the notification gate failed", "err", err)
	}
	if err == nil {
		r.obs.GateClosed(true)
	}
	return err
}

// openGate opens the gate and then asks for a claim pass. A failed Open is
// logged and returned: the gate, if it stayed closed, expires within its
// TTL, and the fallback poll bounds the wait meanwhile.
func (r *Relay) openGate(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, gateTimeout)
	defer cancel()
	err := r.cfg.Gate.Open(ctx)
	if err != nil && ctx.Err() == nil {
		r.log.Warn("opening the notification gate failed", "err", err)
	}
	if err == nil {
		r.obs.GateClosed(false)
	}
	r.poke()
	return err
}
