//go:build faults

package faults

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// world is one scenario's outbox database, exchange and counting consumer.
type world struct {
	t        *testing.T
	url      string
	pool     *pgxpool.Pool
	exchange string
	count    *counter
}

// noteDeletes keeps the id and type of every row deleted from the outbox
// in outbox_deleted, so that a relay that keeps no published row
// (--retention=0) is counted as one that marks them is. A statement-level
// trigger, so a delete of 500 rows writes one insert.
const noteDeletes = `
CREATE TABLE outbox_deleted (id bigint NOT NULL, event_type text NOT NULL);
CREATE INDEX ON outbox_deleted (event_type);
CREATE FUNCTION outbox_note_deletes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO outbox_deleted SELECT id, event_type FROM deleted;
	RETURN NULL;
END $$;
CREATE TRIGGER outbox_note_deletes AFTER DELETE ON outbox
	REFERENCING OLD TABLE AS deleted FOR EACH STATEMENT EXECUTE FUNCTION outbox_note_deletes();`

func newWorld(t *testing.T) *world {
	t.Helper()
	url, pool := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	return worldOn(t, url, pool, exchange, newCounter(t, exchange))
}

// worldOn makes the world of a migrated outbox database that pool reaches
// at url, with the deletes noted (noteDeletes), as every world counts.
func worldOn(t *testing.T, url string, pool *pgxpool.Pool, exchange string, count *counter) *world {
	t.Helper()
	testkit.Exec(t, pool, noteDeletes)
	return &world{t: t, url: url, pool: pool, exchange: exchange, count: count}
}

// relay starts an outboxrelay process on the world with extra arguments.
func (w *world) relay(args ...string) *testkit.Process {
	w.t.Helper()
	return w.relayVia(testkit.AMQPURL(), args...)
}

// relayVia starts a relay that reaches RabbitMQ at amqpURL (a proxy).
func (w *world) relayVia(amqpURL string, args ...string) *testkit.Process {
	w.t.Helper()
	return w.relayThrough(w.url, amqpURL, args...)
}

// relayThrough starts a relay that reaches PostgreSQL at databaseURL and
// RabbitMQ at amqpURL (either may be a proxy).
func (w *world) relayThrough(databaseURL, amqpURL string, args ...string) *testkit.Process {
	w.t.Helper()
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"DATABASE_URL=" + databaseURL,
		"AMQP_URL=" + amqpURL,
		"OUTBOX_EXCHANGE=" + w.exchange,
		"OUTBOX_LOG_FORMAT=json",
		"OUTBOX_HTTP_ADDR=127.0.0.1:0", // metrics on, on a port of its own
	}
	return testkit.StartProcess(w.t, binary, env, append([]string{"run", "--no-migrate"}, args...)...)
}

// faultEnd is when a fault ended, and how many events of the run's type
// were committed by then.
type faultEnd struct {
	at        time.Time
	committed int
}

// ended marks the end of a fault for events of type tag.
func (w *world) ended(tag string) faultEnd {
	w.t.Helper()
	at := time.Now()
	return faultEnd{at: at, committed: w.committed(tag)}
}

// committed is how many events of type tag the table holds, asked until
// the database answers (it may be restarting).
func (w *world) committed(tag string) int {
	w.t.Helper()
	n := -1
	testkit.WaitFor(w.t, time.Minute, tag+": count the committed events", func() bool {
		n = w.rows(tag)
		return n >= 0
	})
	return n
}

// settle waits until every event of tag is marked published and
// delivered, and adds the run to o. What counts as committed is what the
// table holds, at least the n events the producer saw committed (an insert
// whose commit was cut off may have committed anyway). An event that does
// not arrive within a minute of being marked is counted lost, and fails
// the test. The run's recovery time runs from the end of the fault until
// every event committed by then had arrived.
func (w *world) settle(o *outcome, tag string, n int, fault faultEnd) {
	w.t.Helper()
	committed := w.committed(tag)
	if committed < n {
		w.t.Fatalf("%s: the table holds %d events, the producer committed %d", tag, committed, n)
	}
	testkit.WaitFor(w.t, 3*time.Minute, tag+": every event marked published", func() bool { return w.published(tag) == committed })
	arrived := w.count.awaitDistinct(tag, committed, time.Minute)
	distinct, dups := w.count.stats(tag)
	var recovery time.Duration
	if caughtUp, ok := w.count.caughtUp(tag, fault.committed); ok {
		recovery = max(0, caughtUp.Sub(fault.at)) // zero: all had arrived when the fault ended
	}
	w.t.Logf("%s: %d committed, %d delivered, %d duplicates (and %d redelivered by RabbitMQ); the %d committed by the fault's end all arrived %s after it",
		tag, committed, distinct, dups, w.count.redeliveries(tag), fault.committed, recovery.Round(time.Millisecond))
	if !arrived {
		w.t.Errorf("%s: %d of %d committed events never arrived", tag, committed-distinct, committed)
	}
	o.Committed += committed
	o.Delivered += distinct
	o.Lost += committed - distinct
	o.Duplicated += dups
	o.Recovery = append(o.Recovery, recovery)
}

// insert commits n events of type tag in one statement, numbered on from
// those already there.
func (w *world) insert(tag string, n int) {
	w.t.Helper()
	testkit.Exec(w.t, w.pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', (i % 97)::text, $1, jsonb_build_object('n', base + i)
		FROM generate_series(1, $2) AS i, (SELECT count(*) AS base FROM outbox WHERE event_type = $1) AS b`, tag, n)
}

// stream commits total events of type tag in transactions of 50, one every
// 10 ms (5,000 events/s), in the background, so that faults strike while
// events flow rather than after the relay has published a backlog. wait
// returns once all are committed. Inserts that fail while the database
// restarts are retried: an event counts once committed.
func (w *world) stream(tag string, total int) (wait func()) {
	w.t.Helper()
	done := w.streaming(tag, total)
	return func() {
		w.t.Helper()
		select {
		case <-done:
		case <-time.After(5 * time.Minute):
			w.t.Fatalf("%s: the producer did not finish", tag)
		}
	}
}

// streaming is stream without the wait: done is closed once every event is
// committed.
func (w *world) streaming(tag string, total int) (done <-chan struct{}) {
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for sent := 0; sent < total; {
			<-tick.C
			n := min(50, total-sent)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := w.pool.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
				SELECT 'order', (i % 97)::text, $1, jsonb_build_object('n', i)
				FROM generate_series($2::int, $3::int) AS i`, tag, sent+1, sent+n)
			cancel()
			if err == nil {
				sent += n
			}
		}
	}()
	return finished
}

// waitPublished waits until at least n events of type tag are marked
// published: where the relay is, rather than the consumer, which may lag
// it by thousands of events.
func (w *world) waitPublished(tag string, n int, timeout time.Duration) {
	w.t.Helper()
	testkit.WaitFor(w.t, timeout, fmt.Sprintf("%s: %d events published", tag, n), func() bool { return w.published(tag) >= n })
}

// rows is how many events of type tag the table holds or held (deleted,
// see noteDeletes), or -1 while the database cannot be asked.
func (w *world) rows(tag string) int {
	return w.countWithDeleted(tag, "true")
}

// published is how many events of type tag are marked published or were
// deleted once published (--retention=0, see noteDeletes), or -1 while the
// database cannot be asked (it may be restarting).
func (w *world) published(tag string) int {
	return w.countWithDeleted(tag, "status = 'published'")
}

// countWithDeleted counts the events of type tag whose rows meet where
// (a constant of this file), plus those deleted from the table, or -1
// while the database cannot be asked.
func (w *world) countWithDeleted(tag, where string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var n int
	if err := w.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox WHERE event_type = $1 AND `+where+`)
		+ (SELECT count(*) FROM outbox_deleted WHERE event_type = $1)`, tag).Scan(&n); err != nil {
		return -1
	}
	return n
}
