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
// arrive, and the relay's claims must not slow down as the dead row
// versions pile up: the mean claim time of the pin's last 30 s within 1.5
// times that of its first 30 s (from 15 s after the feedback holds), while
// tens of thousands of dead versions are added in between. The mean of
// the 30 s before the pin is reported beside them: on this two-core
// machine, running both servers, the relay, RabbitMQ and the producers,
// the pin adds a step to the claim time that then stays flat
// (docs/reliability.md, scenario 14).
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
	// window is the mean claim time over the next 30 s, and the dead row
	// versions of the table at its end.
	window := func() (time.Duration, int64) {
		from := claimTimes(t, addr)
		time.Sleep(30 * time.Second)
		return claimTimes(t, addr).since(from), testkit.QueryInt(t, w.pool, "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'outbox'")
	}
	time.Sleep(15 * time.Second) // warm up: the windows measure a running relay
	baseline, _ := window()

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
	time.Sleep(15 * time.Second)
	early, deadEarly := window()
	time.Sleep(30 * time.Second)
	late, deadLate := window()
	held := pg.query(0, "SELECT count(*) FROM pg_stat_replication WHERE backend_xmin IS NOT NULL")
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	n = stop()
	end := w.ended(tag)
	w.settle(&o, tag, n, end)
	p.Stop(time.Minute)

	us := func(d time.Duration) time.Duration { return d.Round(time.Microsecond) }
	note := fmt.Sprintf("14: mean claim time %s in the pin's first 30 s (%d dead row versions at its end), %s in its last 30 s (%d dead): %.2fx; %s in the 30 s before the pin (the last 30 s against it: %.2fx)",
		us(early), deadEarly, us(late), deadLate, float64(late)/float64(early), us(baseline), float64(late)/float64(baseline))
	t.Log(note)
	o.Notes = append(o.Notes, note)
	record(o)
	if held != 1 {
		t.Errorf("the standby's feedback no longer held the horizon at the pin's end")
	}
	if o.Lost != 0 {
		t.Fatalf("%d events lost", o.Lost)
	}
	if deadLate-deadEarly < 20_000 {
		t.Errorf("only %d dead row versions added between the windows: the horizon was not held", deadLate-deadEarly)
	}
	if early == 0 || float64(late) > 1.5*float64(early) {
		t.Errorf("claims slowed down as dead row versions piled up: %s against %s", late, early)
	}
}
