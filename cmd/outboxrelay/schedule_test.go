package main_test

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/outbox"
)

// TestScheduledEventsArriveWhenDueNeverBefore writes 2,000 events in one
// transaction, due one after another over 10 s, to a relay whose fallback
// poll is an hour away: every one arrives, none before its time, and each
// within a few seconds of it, so the relay woke for it (the poll would have
// come an hour later). How soon after its time an event arrives is a
// figure of the performance page, not of this test; the test logs it.
func TestScheduledEventsArriveWhenDueNeverBefore(t *testing.T) {
	t.Parallel()
	const n = 2000
	const over = 10 * time.Second
	dbURL, pool := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "#")
	p := startedRelay(t, relayEnv(dbURL, exchange), "--poll-interval=1h")

	first := time.Now().Add(2 * time.Second)
	events := make([]outbox.Event, n)
	for i := range events {
		events[i] = outbox.Event{AggregateType: "reminder", AggregateID: strconv.Itoa(i % 50), EventType: "due",
			Payload: i, NotBefore: first.Add(time.Duration(i) * over / n)}
	}
	var ids []string
	require.NoError(t, pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		var err error
		ids, err = outbox.Writer{}.Write(t.Context(), tx, events...)
		return err
	}))
	due := make(map[string]time.Time, n)
	for i, id := range ids {
		due[id] = events[i].NotBefore
	}

	late := make([]time.Duration, 0, n)
	deadline := time.NewTimer(time.Until(first.Add(over + time.Minute)))
	defer deadline.Stop()
	for len(late) < n {
		select {
		case d := <-queue.Deliveries:
			at := time.Now()
			when, ok := due[d.MessageId]
			require.True(t, ok, "message %s is none of the events written", d.MessageId)
			delete(due, d.MessageId)
			require.False(t, at.Before(when), "event %s arrived %s before its time", d.MessageId, when.Sub(at))
			require.Less(t, at.Sub(when), 5*time.Second, "event %s arrived long after its time: the relay did not wake for it", d.MessageId)
			late = append(late, at.Sub(when))
		case <-p.Done():
			t.Fatalf("the relay exited: %v", p.Err())
		case <-deadline.C:
			t.Fatalf("%d of %d scheduled events arrived", len(late), n)
		}
	}
	slices.Sort(late)
	t.Logf("arrival after the event's time: p50 %s, p99 %s, max %s", late[n/2], late[n*99/100], late[n-1])
	p.Stop(60 * time.Second)
}

// TestCancelRacingTheDueTimeHasOneOutcome cancels scheduled events around
// their time, while the relay publishes them at it: each one is either
// cancelled (Cancel counted it, and it never arrives) or published (Cancel
// counted 0, and it arrives), never both and never neither. The cancels
// are spread from 30 ms before the time to 60 ms after it, so that both
// outcomes occur.
func TestCancelRacingTheDueTimeHasOneOutcome(t *testing.T) {
	t.Parallel()
	const n = 300
	dbURL, pool := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "#")
	p := startedRelay(t, relayEnv(dbURL, exchange), "--poll-interval=1h")

	first := time.Now().Add(2 * time.Second)
	events := make([]outbox.Event, n)
	for i := range events {
		events[i] = outbox.Event{AggregateType: "cart", AggregateID: strconv.Itoa(i), EventType: "expired",
			Payload: i, NotBefore: first.Add(time.Duration(i) * 10 * time.Millisecond)}
	}
	ids, err := outbox.Writer{}.Write(t.Context(), pool, events...)
	require.NoError(t, err)

	cancelled := make(chan string, n)
	kept := make(chan string, n)
	errs := make(chan error, n)
	for i, id := range ids {
		at := events[i].NotBefore.Add(time.Duration(i%10-3) * 10 * time.Millisecond)
		go func() {
			time.Sleep(time.Until(at))
			got, err := outbox.Writer{}.Cancel(t.Context(), pool, id)
			switch {
			case err != nil:
				errs <- err
			case len(got) == 1:
				cancelled <- id
			default:
				kept <- id
			}
		}()
	}
	outcome := map[string]string{}
	for range n {
		select {
		case id := <-cancelled:
			outcome[id] = "cancelled"
		case id := <-kept:
			outcome[id] = "kept"
		case err := <-errs:
			t.Fatalf("cancel: %v", err)
		case <-time.After(time.Minute):
			t.Fatalf("%d of %d cancels returned", len(outcome), n)
		}
	}
	want := 0
	for _, o := range outcome {
		if o == "kept" {
			want++
		}
	}
	arrived := map[string]bool{}
	for len(arrived) < want {
		select {
		case d := <-queue.Deliveries:
			require.NotEqual(t, "cancelled", outcome[d.MessageId], "event %s arrived, though Cancel counted it", d.MessageId)
			arrived[d.MessageId] = true
		case <-p.Done():
			t.Fatalf("the relay exited: %v", p.Err())
		case <-time.After(time.Minute):
			t.Fatalf("%d of the %d events not cancelled arrived", len(arrived), want)
		}
	}
	// The cancelled rows are gone, so nothing can publish them later; the
	// others are all marked published.
	testkit.WaitFor(t, 30*time.Second, "the published events' marks", func() bool {
		return testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE status <> 'published'`) == 0
	})
	require.Equal(t, int64(want), testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox`))
	t.Logf("%d cancelled, %d published", n-want, want)
	require.NotZero(t, want, "no cancel lost the race: the test did not race")
	require.NotEqual(t, n, want, "no cancel won the race: the test did not race")
	p.Stop(60 * time.Second)
}

// TestScheduledHeadHoldsItsAggregateBack: in ordered mode an aggregate's
// first event, scheduled, holds back its later ones, due at once, until it
// is published at its time; then they follow in order. Another aggregate's
// event goes at once.
func TestScheduledHeadHoldsItsAggregateBack(t *testing.T) {
	t.Parallel()
	dbURL, pool := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "#")
	p := startedRelay(t, relayEnv(dbURL, exchange), "--poll-interval=1h", "--ordering=aggregate")

	due := time.Now().Add(1500 * time.Millisecond)
	ids, err := outbox.Writer{}.Write(t.Context(), pool,
		outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "reminder", Payload: 1, NotBefore: due},
		outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "shipped", Payload: 2},
		outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "delivered", Payload: 3},
		outbox.Event{AggregateType: "order", AggregateID: "2", EventType: "created", Payload: 4},
	)
	require.NoError(t, err)
	var got []string
	for len(got) < len(ids) {
		select {
		case d := <-queue.Deliveries:
			at := time.Now()
			if d.MessageId != ids[3] {
				require.False(t, at.Before(due), "event %s of the held aggregate arrived %s before its head's time", d.MessageId, due.Sub(at))
			}
			got = append(got, d.MessageId)
		case <-p.Done():
			t.Fatalf("the relay exited: %v", p.Err())
		case <-time.After(time.Minute):
			t.Fatalf("%d of %d events arrived", len(got), len(ids))
		}
	}
	require.Equal(t, []string{ids[3], ids[0], ids[1], ids[2]}, got, "the other aggregate first, then the head and its followers in order")
	p.Stop(60 * time.Second)
}

// TestEventsDueWhileTheRelayWasDownArriveAtStart: events that fell due while
// no relay ran (it was killed before their time) are published as soon as a
// relay starts, however late, not at its next poll (an hour away).
func TestEventsDueWhileTheRelayWasDownArriveAtStart(t *testing.T) {
	t.Parallel()
	const n = 200
	dbURL, pool := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "#")
	env := relayEnv(dbURL, exchange)
	p := startedRelay(t, env, "--poll-interval=1h")
	first := time.Now().Add(time.Second)
	events := make([]outbox.Event, n)
	for i := range events {
		events[i] = outbox.Event{AggregateType: "reminder", AggregateID: strconv.Itoa(i), EventType: "due",
			Payload: i, NotBefore: first.Add(time.Duration(i) * time.Millisecond)}
	}
	_, err := outbox.Writer{}.Write(t.Context(), pool, events...)
	require.NoError(t, err)
	p.Kill()
	require.Zero(t, testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE status <> 'pending'`), "the relay published before its kill")

	// The relay is down until every event is overdue.
	testkit.WaitFor(t, 30*time.Second, "the events to fall due", func() bool {
		return testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE available_at <= now() - interval '500 milliseconds'`) == n
	})
	p = startRelay(t, env, "--poll-interval=1h")
	seen := map[string]bool{}
	for len(seen) < n {
		select {
		case d := <-queue.Deliveries:
			seen[d.MessageId] = true
		case <-p.Done():
			t.Fatalf("the relay exited: %v", p.Err())
		case <-time.After(time.Minute):
			t.Fatalf("%d of %d overdue events arrived", len(seen), n)
		}
	}
	p.Stop(60 * time.Second)
}
