package notify_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/notify"
)

// A dispatcher's loop: every wake-up is one pass over the table. Whether the
// insert's NOTIFY arrives, or was sent before the listener was listening and
// is caught up by the pass after LISTEN succeeds, the row is claimed: the
// notification is only a hint.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The example shares the suite's database, so its table and channel
	// have unique names.
	databaseURL := testkit.PostgresURL()
	table := pgx.Identifier{testkit.UniqueName("example_outbox")}.Sanitize()
	channel := testkit.UniqueName("example")

	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+table+" (payload text NOT NULL)"); err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Exec(context.Background(), "DROP TABLE "+table)

	connConfig, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	listener, err := notify.New(notify.Config{
		ConnConfig: connConfig,
		Channel:    channel,
		Pinger:     pool, // heartbeat through the pool, not the listening connection
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- listener.Run(runCtx) }()

	// claim stands in for the dispatcher's claim pass.
	claim := func() []string {
		rows, _ := pool.Query(ctx, "DELETE FROM "+table+" RETURNING payload")
		payloads, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			fmt.Println(err)
		}
		return payloads
	}

	<-listener.C() // the wake-up at start
	fmt.Println("first pass:", len(claim()), "rows")

	// What an application transaction and the outbox trigger do.
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES ('hello')"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "SELECT pg_notify($1, '')", channel)
		return err
	}); err != nil {
		fmt.Println(err)
	}

	for claimed := false; !claimed; {
		select {
		case <-listener.C():
			for _, payload := range claim() {
				fmt.Println("claimed:", payload)
				claimed = true
			}
		case <-ctx.Done():
			fmt.Println("no wake-up:", ctx.Err())
			claimed = true
		}
	}

	stop()
	fmt.Println("stopped:", <-done)
	// Output:
	// first pass: 0 rows
	// claimed: hello
	// stopped: <nil>
}
