package inbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outboxrelay/inbox"
	"github.com/outboxrelay/outboxrelay/outbox"
)

// Chaining services: the shipping service consumes "order created" and, in
// the handler's transaction, records the shipment and writes a "shipment
// requested" event with the producer library. The event exists exactly when
// the shipment does, and both exist once, though the message came twice (as
// after a relay's crash before its mark): the relay publishes the new event
// once the transaction commits.
func Example_chaining() {
	ctx := context.Background()
	env, err := newExampleEnv(ctx) // a database with the relay's outbox table; a queue with a dead-letter exchange
	if err != nil {
		fmt.Println(err)
		return
	}
	defer env.close()
	pool, err := pgxpool.New(ctx, env.databaseURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	if err := inbox.Migrate(ctx, pool, ""); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE shipments (order_id int PRIMARY KEY)`); err != nil {
		fmt.Println(err)
		return
	}

	reg := prometheus.NewRegistry()
	consumer, err := inbox.New(inbox.Config{
		AMQPURL:    env.amqpURL,
		Queue:      env.queue,
		Name:       "shipping",
		DB:         pool,
		Registerer: reg,
		Handler: func(ctx context.Context, tx pgx.Tx, d amqp.Delivery) error {
			var order struct {
				ID int `json:"id"`
			}
			if err := json.Unmarshal(d.Body, &order); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO shipments (order_id) VALUES ($1)`, order.ID); err != nil {
				return err
			}
			_, err := outbox.Writer{}.Write(ctx, tx, outbox.Event{
				AggregateType: "shipment",
				AggregateID:   strconv.Itoa(order.ID),
				EventType:     "requested",
				Payload:       map[string]any{"order_id": order.ID},
			})
			return err
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- consumer.Run(runCtx) }()

	// The relay publishes each event with its id as the message-id.
	for range 2 {
		if err := env.publish(ctx, "0b7e4c1a-9d5e-4f7a-8a52-3c2d1e0f9a11", `{"id": 42}`); err != nil {
			fmt.Println(err)
		}
	}
	waitFor(func() bool {
		return counterValue(reg, "inbox_processed_total")+counterValue(reg, "inbox_duplicates_total") == 2
	})
	stop()
	if err := <-done; err != nil {
		fmt.Println(err)
	}

	var shipments int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM shipments`).Scan(&shipments)
	fmt.Println("shipments:", shipments)
	rows, _ := pool.Query(ctx, `SELECT aggregate_type, aggregate_id, event_type, payload::text FROM outbox ORDER BY id`)
	events, _ := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var typ, id, event, payload string
		err := r.Scan(&typ, &id, &event, &payload)
		return fmt.Sprint(typ, " ", id, " ", event, " ", payload), err
	})
	fmt.Println("events:", events)
	fmt.Println("processed:", counterValue(reg, "inbox_processed_total"), "duplicates:", counterValue(reg, "inbox_duplicates_total"))
	// Output:
	// shipments: 1
	// events: [shipment 42 requested {"order_id": 42}]
	// processed: 1 duplicates: 1
}

// waitFor polls cond every 10ms, for up to 20s.
func waitFor(cond func() bool) {
	for deadline := time.Now().Add(20 * time.Second); !cond() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
}

// counterValue sums the counter name's values in reg.
func counterValue(reg *prometheus.Registry, name string) float64 {
	families, _ := reg.Gather()
	var sum float64
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
