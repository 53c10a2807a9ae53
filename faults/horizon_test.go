//go:build faults

package faults

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// paced commits events of type tag, one per transaction, at rate a
// second, until stop is called; stop returns how many it committed.
func (w *world) paced(tag string, rate int) (stop func() int) {
	ctx, cancel := context.WithCancel(context.Background())
	var (
		wg   sync.WaitGroup
		sent int
	)
	wg.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		start := time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			for due := int(time.Since(start).Seconds() * float64(rate)); sent < due && ctx.Err() == nil; {
				opCtx, opCancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := w.pool.Exec(opCtx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
					VALUES ('order', ($2::int % 97)::text, $1, jsonb_build_object('n', $2::int))`, tag, sent+1)
				opCancel()
				if err == nil {
					sent++
				}
			}
		}
	})
	return func() int { cancel(); wg.Wait(); return sent }
}

// claimMean is the relay's mean claim time since the sample before.
type claimMean struct{ sum, count float64 }

func claimTimes(t *testing.T, addr string) claimMean {
	m := testkit.Scrape(t, addr)
	return claimMean{m.Value("outboxrelay_claim_duration_seconds_sum"), m.Value("outboxrelay_claim_duration_seconds_count")}
}

func (c claimMean) since(before claimMean) time.Duration {
	if c.count <= before.count {
		return 0
	}
	return time.Duration((c.sum - before.sum) / (c.count - before.count) * float64(time.Second))
}

// Scenario 14: a PostgreSQL primary and its standby, which runs with
// hot_standby_feedback: a long REPEATABLE READ query on the standby holds
// back the primary's vacuum horizon (its feedback) while producers write
// 1,000 events/s, one per transaction, for two minutes. Every event must
// arrive, and the relay's claims must not slow down: the mean claim time
// of the pin's last 30 s within 1.5 times that of the 30 s before it.
func TestStandbyQueryHoldsBackVacuum(t *testing.T) {
	pg := newPGPair(t)
	pg.exec(1, "ALTER SYSTEM SET hot_standby_feedback = on")
	pg.exec(1, "ALTER SYSTEM SET max_standby_streaming_delay = -1") // the query is never cancelled
	pg.exec(1, "SELECT pg_reload_conf()")
	const db = "outboxrelay_horizon"
	pg.exec(0, "CREATE DATABASE "+db)
	url := pg.url(db) + "?target_session_attrs=read-write"
	testkit.Migrate(t, url)
	exchange := testkit.NewExchange(t)
	w := worldOn(t, url, testkit.NewPool(t, url), exchange, newCounter(t, exchange))
	o := outcome{Scenario: "14 a standby's long query holds back the primary's vacuum (hot_standby_feedback)"}

	p := w.relayThrough(pg.url(db), testkit.AMQPURL())
	addr := testkit.HTTPAddr(t, p.Out)
	const tag = "horizon"
	stop := w.paced(tag, 1000)
	time.Sleep(15 * time.Second) // warm up: the windows measure a running relay
	before := claimTimes(t, addr)
	time.Sleep(30 * time.Second)
	baseline := claimTimes(t, addr).since(before)

	standby := pg.conn(1)
	defer standby.Close(context.Background())
	ctx := context.Background()
	tx, err := standby.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM pg_class").Scan(&n); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 30*time.Second, "the standby's feedback to hold the primary's horizon", func() bool {
		return pg.query(0, "SELECT count(*) FROM pg_stat_replication WHERE backend_xmin IS NOT NULL") == 1
	})
	time.Sleep(90 * time.Second)
	before = claimTimes(t, addr)
	time.Sleep(30 * time.Second)
	pinned := claimTimes(t, addr).since(before)
	held := pg.query(0, "SELECT count(*) FROM pg_stat_replication WHERE backend_xmin IS NOT NULL")
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	n = stop()
	end := w.ended(tag)
	w.settle(&o, tag, n, end)
	p.Stop(time.Minute)

	t.Logf("%s: mean claim time %s in the 30 s before the standby's query, %s in the last 30 s of its two minutes", tag,
		baseline.Round(time.Microsecond), pinned.Round(time.Microsecond))
	o.Notes = append(o.Notes, fmt.Sprintf("14: mean claim time %s before the standby's query, %s in the last 30 s of its two minutes (%.2fx)",
		baseline.Round(time.Microsecond), pinned.Round(time.Microsecond), float64(pinned)/float64(baseline)))
	record(o)
	if held != 1 {
		t.Errorf("the standby's feedback no longer held the horizon at the pin's end")
	}
	if o.Lost != 0 {
		t.Fatalf("%d events lost", o.Lost)
	}
	if baseline == 0 || float64(pinned) > 1.5*float64(baseline) {
		t.Errorf("claims slowed down while the horizon was held: %s against %s", pinned, baseline)
	}
}
