package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/outboxrelay/outboxrelay/outbox"
)

type Order struct {
	ID       int     `json:"id"`
	Customer string  `json:"customer"`
	Total    float64 `json:"total"`
}

// The business write and its event, in one pgx transaction: the event
// exists exactly when the order does.
func ExampleWriter_Write() {
	ctx := context.Background()
	databaseURL, drop := exampleDatabase()
	defer drop()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()

	order := Order{ID: 42, Customer: "ada", Total: 99.50}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, customer, total) VALUES ($1, $2, $3)`,
			order.ID, order.Customer, order.Total); err != nil {
			return err
		}
		_, err := outbox.Writer{}.Write(ctx, tx, outbox.Event{
			AggregateType: "order",
			AggregateID:   fmt.Sprint(order.ID),
			EventType:     "created",
			Payload:       order,
			Headers:       map[string]any{"tenant": "acme"},
		})
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	printOutbox(ctx, pool)
	// Output:
	// 1 order 42 created {"id": 42, "total": 99.5, "customer": "ada"} {"tenant": "acme"}
}

// The same with database/sql, here through pgx's stdlib driver.
func ExampleWriter_WriteSQL() {
	ctx := context.Background()
	databaseURL, drop := exampleDatabase()
	defer drop()
	db, err := sql.Open("pgx", databaseURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()

	write := func() error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, customer, total) VALUES ($1, $2, $3)`, 7, "grace", 12.0); err != nil {
			return err
		}
		if _, err := (outbox.Writer{}).WriteSQL(ctx, tx, outbox.Event{
			AggregateType: "order", AggregateID: "7", EventType: "created",
			Payload:    Order{ID: 7, Customer: "grace", Total: 12},
			RoutingKey: "orders.new", // instead of order.created
		}); err != nil {
			return err
		}
		return tx.Commit()
	}
	if err := write(); err != nil {
		fmt.Println(err)
		return
	}
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	printOutbox(ctx, pool)
	// Output:
	// 1 order 7 created {"id": 7, "total": 12, "customer": "grace"} <nil>
}

// A transaction that rolls back takes its events with it: the relay never
// sees them.
func Example_rollback() {
	ctx := context.Background()
	databaseURL, drop := exampleDatabase()
	defer drop()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()

	tx, err := pool.Begin(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	_, err = outbox.Writer{}.Write(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "1", EventType: "created", Payload: Order{ID: 1}})
	fmt.Println("written:", err)
	fmt.Println("rolled back:", tx.Rollback(ctx))

	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("events in the outbox:", n)
	// Output:
	// written: <nil>
	// rolled back: <nil>
	// events in the outbox: 0
}

// Many events go in one statement, in the order given, which is the order
// the relay claims them in. One bad event refuses the whole batch before
// anything is written.
func Example_batch() {
	ctx := context.Background()
	databaseURL, drop := exampleDatabase()
	defer drop()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()

	events := []outbox.Event{
		{AggregateType: "order", AggregateID: "42", EventType: "created", Payload: Order{ID: 42, Customer: "ada", Total: 99.5}},
		{AggregateType: "order", AggregateID: "42", EventType: "paid", Payload: map[string]any{"id": 42, "method": "card"}},
		{AggregateType: "invoice", AggregateID: "9", EventType: "sent", Payload: []byte(`{"invoice": 9}`), Exchange: "billing"},
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := (outbox.Writer{}).Write(ctx, tx, append(events, outbox.Event{AggregateType: "order", EventType: "shipped"})...); err != nil {
			fmt.Println(err)
		}
		_, err := outbox.Writer{}.Write(ctx, tx, events...)
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	printOutbox(ctx, pool)
	// Output:
	// outbox: invalid event: event 3: AggregateID: empty
	// 1 order 42 created {"id": 42, "total": 99.5, "customer": "ada"} <nil>
	// 2 order 42 paid {"id": 42, "method": "card"} <nil>
	// 3 invoice 9 sent {"invoice": 9} <nil>
}

// An event can carry an id of the application's choosing (here the order's
// own UUID, so a consumer can link the message to the order) and a time
// before which the relay does not publish it: a reminder a day later.
// Write returns the ids of what it wrote, generated where none was given.
func Example_scheduledWithIDs() {
	ctx := context.Background()
	databaseURL, drop := exampleDatabase()
	defer drop()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()

	orderUUID := "3F2504E0-4F89-41D3-9A0C-0305E82C3301"
	var ids []string
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		ids, err = outbox.Writer{}.Write(ctx, tx,
			outbox.Event{ID: orderUUID, AggregateType: "order", AggregateID: "42", EventType: "created", Payload: Order{ID: 42}},
			outbox.Event{AggregateType: "order", AggregateID: "42", EventType: "payment-reminder", Payload: Order{ID: 42},
				NotBefore: time.Now().Add(24 * time.Hour)},
		)
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("the order's event:", ids[0])
	var generated string
	var dueIn float64 // seconds
	if err := pool.QueryRow(ctx, `SELECT event_id::text, extract(epoch FROM available_at - now())::float8 FROM outbox WHERE event_type = 'payment-reminder'`).
		Scan(&generated, &dueIn); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("the reminder's id is the one returned:", generated == ids[1])
	fmt.Println("the reminder falls due in about a day:", (time.Duration(dueIn) * time.Second).Round(time.Hour))
	// Output:
	// the order's event: 3f2504e0-4f89-41d3-9a0c-0305e82c3301
	// the reminder's id is the one returned: true
	// the reminder falls due in about a day: 24h0m0s
}

// A cart expires in 30 minutes unless the customer checks out first: the
// checkout cancels the expiry in its own transaction. A cancel counts 1
// while no relay has taken the event; then it is never published.
func ExampleWriter_Cancel() {
	ctx := context.Background()
	databaseURL, drop := exampleDatabase()
	defer drop()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()

	w := outbox.Writer{}
	ids, err := w.Write(ctx, pool, outbox.Event{AggregateType: "cart", AggregateID: "7", EventType: "expired",
		Payload: map[string]int{"cart": 7}, NotBefore: time.Now().Add(30 * time.Minute)})
	if err != nil {
		fmt.Println(err)
		return
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... the checkout's own writes ...
		cancelled, err := w.Cancel(ctx, tx, ids[0])
		fmt.Println("expiry cancelled:", len(cancelled) == 1 && cancelled[0] == ids[0])
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	cancelled, err := w.Cancel(ctx, pool, ids[0])
	fmt.Println("cancelled again:", len(cancelled), err)
	// Output:
	// expiry cancelled: true
	// cancelled again: 0 <nil>
}

// A service that speaks Protocol Buffers writes the encoded message as
// PayloadBytes with its content type; the relay publishes the bytes as
// they are, with that content-type.
func Example_binaryPayload() {
	ctx := context.Background()
	databaseURL, drop := exampleDatabase()
	defer drop()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()

	encoded := []byte{0x08, 0x2a, 0x12, 0x04, 'p', 'a', 'i', 'd'} // e.g. proto.Marshal(&pb.OrderPaid{Id: 42, State: "paid"})
	_, err = outbox.Writer{}.Write(ctx, pool, outbox.Event{
		AggregateType: "order", AggregateID: "42", EventType: "paid",
		PayloadBytes: encoded, ContentType: "application/x-protobuf",
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	var stored []byte
	var contentType, payload string
	if err := pool.QueryRow(ctx, `SELECT payload_bytes, content_type, payload::text FROM outbox`).Scan(&stored, &contentType, &payload); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%x %s, payload %s\n", stored, contentType, payload)
	// Output:
	// 082a120470616964 application/x-protobuf, payload null
}

// printOutbox prints the outbox's rows in id order.
func printOutbox(ctx context.Context, pool *pgxpool.Pool) {
	rows, err := pool.Query(ctx, `SELECT id, aggregate_type, aggregate_id, event_type, payload::text, headers::text FROM outbox ORDER BY id`)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var id int64
		var aggType, aggID, eventType, payload string
		var headers *string
		if err := rows.Scan(&id, &aggType, &aggID, &eventType, &payload, &headers); err != nil {
			fmt.Println(err)
			return
		}
		h := "<nil>"
		if headers != nil {
			h = *headers
		}
		fmt.Println(id, aggType, aggID, eventType, payload, h)
	}
	if err := rows.Err(); err != nil {
		fmt.Println(err)
	}
}

// exampleDatabase creates a database of the example's own, with the relay's
// migrations (the outbox table) and an orders table, and returns its URL and
// a function dropping it. Examples have no *testing.T, so this is newOutbox
// (database_test.go) by hand.
func exampleDatabase() (string, func()) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	databaseURL, drop, err := createDatabase(ctx)
	if err != nil {
		panic(err)
	}
	mustDrop := func() {
		if err := drop(); err != nil {
			panic(err)
		}
	}
	if err := migrate(ctx, databaseURL); err != nil {
		mustDrop()
		panic(err)
	}
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		mustDrop()
		panic(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE orders (id bigint PRIMARY KEY, customer text NOT NULL, total numeric NOT NULL)`); err != nil {
		mustDrop()
		panic(err)
	}
	return databaseURL, mustDrop
}
