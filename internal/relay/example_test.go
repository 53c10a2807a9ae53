package relay_test

import (
	"context"
	"fmt"
	"log"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outboxrelay/claim"
	"github.com/outboxrelay/outboxrelay/internal/relay"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/migrations"
	"github.com/outboxrelay/outboxrelay/notify"
	"github.com/outboxrelay/outboxrelay/publish"
)

// Example wires the three parts into a relay, writes an event in a business
// transaction and receives it from RabbitMQ. It works in a schema and an
// exchange of its own (through search_path) and removes them afterwards.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	schema := testkit.UniqueName("example")
	exchange := testkit.UniqueName("example")
	admin, err := pgx.Connect(ctx, testkit.PostgresURL())
	if err != nil {
		log.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		log.Fatal(err)
	}
	defer admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
	u, _ := url.Parse(testkit.PostgresURL())
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	databaseURL := u.String()

	// The schema, as `outboxrelay migrate` would apply it.
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := migrations.Migrate(ctx, conn, nil); err != nil {
		log.Fatal(err)
	}
	conn.Close(ctx)

	// The three parts and the dispatcher.
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := claim.New(pool, claim.Config{})
	if err != nil {
		log.Fatal(err)
	}
	pub, err := publish.Dial(ctx, publish.Config{URL: testkit.AMQPURL(), Exchange: exchange})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	connConfig, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		log.Fatal(err)
	}
	listener, err := notify.New(notify.Config{ConnConfig: connConfig, Pinger: pool})
	if err != nil {
		log.Fatal(err)
	}
	r, err := relay.New(relay.Config{}, store, pub, listener)
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()

	// A consumer bound to the exchange.
	consumer, err := amqp.Dial(testkit.AMQPURL())
	if err != nil {
		log.Fatal(err)
	}
	defer consumer.Close()
	ch, _ := consumer.Channel()
	defer ch.ExchangeDelete(exchange, false, false)
	queue, _ := ch.QueueDeclare("", false, true, true, false, nil)
	if err := ch.QueueBind(queue.Name, "order.*", exchange, false, nil); err != nil {
		log.Fatal(err)
	}
	deliveries, _ := ch.Consume(queue.Name, "", true, true, false, false, nil)

	// The producer: the business write and its event, in one transaction.
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
		VALUES ('order', '42', 'created', '{"total": 99.5}')`); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}

	select {
	case d := <-deliveries:
		fmt.Println(d.RoutingKey, d.Type, d.Headers["aggregate_id"], string(d.Body))
	case <-time.After(30 * time.Second):
		fmt.Println("no delivery")
	}
	cancel()
	fmt.Println("stopped:", <-done)
	// Output:
	// order.created created 42 {"total": 99.5}
	// stopped: <nil>
}
