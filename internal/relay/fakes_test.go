package relay_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/relay"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/publish"
)

// The fakes of the dispatcher tests: a store, a publisher and a listener
// that record every call and do what each test scripts, and a relay that
// runs on them and on a fake clock.

var _ relay.Clock = (*testkit.Clock)(nil)

// awaitTimeout bounds every real-time wait of the dispatcher tests: the
// relay acts on an event at once, so only a broken relay comes near it.
const awaitTimeout = 10 * time.Second

// storeCall is one call to the fake store.
type storeCall struct {
	op    string // claim, mark, mark+claim, retry, release, extend or delete
	ctx   context.Context
	lease claim.LeaseID
	ids   []int64
}

// fakeStore is a relay.Store. Each method records its call on calls and
// then calls the test's function for it; without one, it answers as a
// healthy, empty outbox would.
type fakeStore struct {
	calls   chan storeCall
	claim   func(ctx context.Context) (claim.Batch, error)
	mark    func(ctx context.Context, ids []int64) (int64, error)
	retry   func(ctx context.Context, failures []claim.Failure) (claim.RetryResult, error)
	release func(ctx context.Context, ids []int64) (int64, error)
	extend  func(ctx context.Context, ids []int64) (int64, error)
	// unblocks answers Unblocks; without it, no failure unblocks.
	unblocks func(f claim.Failure) bool
}

func newFakeStore() *fakeStore { return &fakeStore{calls: make(chan storeCall, 1000)} }

// plainClaim records a claim that carries no marks.
func (s *fakeStore) plainClaim(ctx context.Context) (claim.Batch, error) {
	s.calls <- storeCall{op: "claim", ctx: ctx}
	if s.claim == nil {
		return claim.Batch{}, nil
	}
	return s.claim(ctx)
}

// MarkAndClaim records one call, "mark+claim", when it has marks to
// make, and then does what the test's mark and claim functions say;
// without marks it records a "claim".
func (s *fakeStore) MarkAndClaim(ctx context.Context, published []int64, _ int) (claim.Batch, error) {
	if len(published) == 0 {
		return s.plainClaim(ctx)
	}
	s.calls <- storeCall{op: "mark+claim", ctx: ctx, ids: published}
	if s.mark != nil {
		if _, err := s.mark(ctx, published); err != nil {
			return claim.Batch{}, err
		}
	}
	if s.claim == nil {
		return claim.Batch{}, nil
	}
	return s.claim(ctx)
}

func (s *fakeStore) MarkPublished(ctx context.Context, ids []int64) (int64, error) {
	s.calls <- storeCall{op: "mark", ctx: ctx, ids: ids}
	if s.mark == nil {
		return int64(len(ids)), nil
	}
	return s.mark(ctx, ids)
}

func (s *fakeStore) Retry(ctx context.Context, lease claim.LeaseID, failures []claim.Failure) (claim.RetryResult, error) {
	ids := make([]int64, len(failures))
	for i, f := range failures {
		ids[i] = f.ID
	}
	s.calls <- storeCall{op: "retry", ctx: ctx, lease: lease, ids: ids}
	if s.retry == nil {
		return claim.RetryResult{}, nil
	}
	return s.retry(ctx, failures)
}

func (s *fakeStore) Release(ctx context.Context, lease claim.LeaseID, ids []int64) (int64, error) {
	s.calls <- storeCall{op: "release", ctx: ctx, lease: lease, ids: ids}
	if s.release == nil {
		return int64(len(ids)), nil
	}
	return s.release(ctx, ids)
}

func (s *fakeStore) Extend(ctx context.Context, lease claim.LeaseID, ids []int64) (int64, error) {
	s.calls <- storeCall{op: "extend", ctx: ctx, lease: lease, ids: ids}
	if s.extend == nil {
		return int64(len(ids)), nil
	}
	return s.extend(ctx, ids)
}

func (s *fakeStore) DeletePublished(ctx context.Context, _ time.Duration, _ int) (int64, error) {
	s.calls <- storeCall{op: "delete", ctx: ctx}
	return 0, nil
}

// next returns the store's next call, failing the test unless it is op.
func (s *fakeStore) next(t *testing.T, op string) storeCall {
	t.Helper()
	select {
	case c := <-s.calls:
		require.Equal(t, op, c.op, "the store's next call")
		return c
	case <-time.After(awaitTimeout):
		t.Fatalf("no %s within %s", op, awaitTimeout)
		return storeCall{}
	}
}

// noMoreCalls fails the test if the store has calls not yet taken.
func (s *fakeStore) noMoreCalls(t *testing.T) {
	t.Helper()
	select {
	case c := <-s.calls:
		t.Fatalf("unexpected store call %s %v", c.op, c.ids)
	default:
	}
}

// publishCall is one call to the fake publisher's Publish.
type publishCall struct {
	ctx  context.Context
	msgs []publish.Message
}

// fakePublisher is a relay.Publisher: always ready, and its Publish records
// the call, then calls the test's function; without one, RabbitMQ confirms
// every message.
type fakePublisher struct {
	calls   chan publishCall
	publish func(ctx context.Context, msgs []publish.Message) []error
	// waitReady, if set, answers WaitReady.
	waitReady func(ctx context.Context) error
}

func newFakePublisher() *fakePublisher { return &fakePublisher{calls: make(chan publishCall, 1000)} }

func (p *fakePublisher) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

func (p *fakePublisher) WaitReady(ctx context.Context) error {
	if p.waitReady != nil {
		return p.waitReady(ctx)
	}
	return ctx.Err()
}

func (p *fakePublisher) Publish(ctx context.Context, msgs []publish.Message) []error {
	p.calls <- publishCall{ctx: ctx, msgs: slices.Clone(msgs)} // the relay may reuse msgs
	if p.publish == nil {
		return make([]error, len(msgs))
	}
	return p.publish(ctx, msgs)
}

// next returns the next Publish call.
func (p *fakePublisher) next(t *testing.T) publishCall {
	t.Helper()
	select {
	case c := <-p.calls:
		return c
	case <-time.After(awaitTimeout):
		t.Fatalf("no publish within %s", awaitTimeout)
		return publishCall{}
	}
}

// fakeListener is a relay.Listener whose notifications the test sends.
type fakeListener struct {
	c       chan struct{}
	signals atomic.Uint64
}

func (l *fakeListener) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

func (l *fakeListener) C() <-chan struct{} { return l.c }

func (l *fakeListener) Signals() uint64 { return l.signals.Load() }

// notify wakes the relay as a notification would.
func (l *fakeListener) notify(t *testing.T) {
	t.Helper()
	l.signals.Add(1)
	l.handOff(t)
}

// handOff hands a wake-up already counted in Signals to a worker, as C
// does with each of several notifications read together.
func (l *fakeListener) handOff(t *testing.T) {
	t.Helper()
	select {
	case l.c <- struct{}{}:
	case <-time.After(awaitTimeout):
		t.Fatalf("the relay took no notification within %s", awaitTimeout)
	}
}

// awaitIdle waits until the relay's worker takes a wake-up that is not
// counted in Signals, which it drops as covered: the worker is back
// waiting, done with whatever pass the wake-ups before started. It needs a
// relay of one worker.
func (l *fakeListener) awaitIdle(t *testing.T) {
	t.Helper()
	l.handOff(t)
}

// dispatcher is a relay running on fakes and a fake clock.
type dispatcher struct {
	clock    *testkit.Clock
	store    *fakeStore
	pub      *fakePublisher
	listener *fakeListener
	cfg      relay.Config
	cancel   context.CancelFunc
	done     chan error
}

// newDispatcher returns fakes for a relay with one worker, no cleanup,
// its fallback poll an hour away, so that nothing but the test wakes it,
// and each batch marked as soon as it is confirmed (marks_test.go has the
// marks that wait for the next claim); the test scripts the fakes and
// adjusts cfg, then calls start.
func newDispatcher(t *testing.T) *dispatcher {
	clock := testkit.NewClock()
	return &dispatcher{
		clock:    clock,
		store:    newFakeStore(),
		pub:      newFakePublisher(),
		listener: &fakeListener{c: make(chan struct{})},
		cfg: relay.Config{
			Workers:         1,
			PollInterval:    time.Hour,
			CleanupInterval: -1,
			MarkDelay:       -1,
			ShutdownTimeout: 20 * time.Second,
			Clock:           clock,
			Logger:          testLogger(t),
		},
	}
}

// start runs the relay; the test's end stops it.
func (d *dispatcher) start(t *testing.T) {
	t.Helper()
	r, err := relay.New(d.cfg, d.store, d.pub, d.listener)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel, d.done = cancel, make(chan error, 1)
	go func() { d.done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-d.done:
		case <-time.After(awaitTimeout):
			t.Errorf("Run did not return within %s of the test's end", awaitTimeout)
		}
	})
}

// returned waits for Run to return and returns its error.
func (d *dispatcher) returned(t *testing.T) error {
	t.Helper()
	select {
	case err := <-d.done:
		d.done <- err // for the cleanup
		return err
	case <-time.After(awaitTimeout):
		t.Fatalf("Run did not return within %s", awaitTimeout)
		return nil
	}
}

// awaitTimer waits until the relay has armed a timer due exactly left from
// now.
func (d *dispatcher) awaitTimer(t *testing.T, what string, left time.Duration) {
	t.Helper()
	d.clock.AwaitTimer(t, awaitTimeout, what, func(l time.Duration) bool { return l == left })
}

// discardCalls drains the fakes' call records for a test that does not
// read them, until the test ends. Call it after start: its cleanup then
// runs before the relay's own.
func (d *dispatcher) discardCalls(t *testing.T) {
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	go func() {
		for {
			select {
			case <-d.store.calls:
			case <-d.pub.calls:
			case <-stop:
				return
			}
		}
	}()
}

// advanceTo moves the clock by d, first to just before it, requiring that
// no timer falls due before d and that one does at d: whatever the relay
// does at d, it cannot have done earlier.
func (d *dispatcher) advanceTo(t *testing.T, what string, by time.Duration) {
	t.Helper()
	require.Zero(t, d.clock.Advance(by-time.Millisecond), "a timer fell due before %s", what)
	require.Positive(t, d.clock.Advance(time.Millisecond), "no timer fell due at %s", what)
}

// testBatch is a claimed batch of events with the given ids, each its own
// insert order (Seq) too.
func testBatch(leaseFor time.Duration, ids ...int64) claim.Batch {
	b := claim.Batch{Lease: claim.LeaseID{0xaa, byte(len(ids))}, LeaseFor: leaseFor}
	for _, id := range ids {
		b.Events = append(b.Events, claim.Event{
			ID: id, Seq: id, EventID: fmt.Sprintf("event-%d", id), AggregateType: "order",
			AggregateID: fmt.Sprint(id), EventType: "created", Payload: []byte(`{}`), Attempts: 1,
		})
	}
	return b
}

// claims returns a Claim function that returns the batches in turn, then
// empty ones.
func claims(batches ...claim.Batch) func(context.Context) (claim.Batch, error) {
	return func(context.Context) (claim.Batch, error) {
		if len(batches) == 0 {
			return claim.Batch{}, nil
		}
		b := batches[0]
		batches = slices.Delete(batches, 0, 1)
		return b, nil
	}
}

// failAll returns err for every message.
func failAll(n int, err error) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// Unblocks asks the test's function; without one, it is false.
func (s *fakeStore) Unblocks(f claim.Failure) bool { return s.unblocks != nil && s.unblocks(f) }
