package publish_test

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outboxrelay/publish"
)

func Example() {
	ctx := context.Background()
	const url = "amqp://guest:guest@127.0.0.1:5672/"

	pub, err := publish.Dial(ctx, publish.Config{URL: url, Exchange: "outboxrelay_example"})
	if err != nil {
		fmt.Println(err)
		return
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- pub.Run(runCtx) }() // reconnects until stopped
	defer func() { stop(); <-done }()

	// A consumer's queue for orders (normally declared by the consumer).
	conn, err := amqp.Dial(url)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close()
	ch, _ := conn.Channel()
	q, _ := ch.QueueDeclare("", false, true, true, false, nil)
	_ = ch.QueueBind(q.Name, "order.#", "outboxrelay_example", false, nil)
	defer ch.ExchangeDelete("outboxrelay_example", false, false)

	headers, err := publish.HeadersFromJSON([]byte(`{"tenant":"acme","priority":2}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := pub.WaitReady(ctx); err != nil {
		fmt.Println(err)
		return
	}
	errs := pub.Publish(ctx, []publish.Message{
		{RoutingKey: "order.created", MessageID: "evt-1", Type: "order.created", Timestamp: time.Now(), Headers: headers, Body: []byte(`{"id":1}`)},
		{RoutingKey: "invoice.sent", MessageID: "evt-2", Type: "invoice.sent", Timestamp: time.Now(), Body: []byte(`{"id":2}`)},
		{RoutingKey: "order.paid", MessageID: "evt-3", Type: "order.paid", Timestamp: time.Now(), Body: make([]byte, 32<<20)},
	})
	for i, err := range errs {
		fmt.Printf("message %d: %v\n", i+1, err)
	}
	// Output:
	// message 1: <nil>
	// message 2: publish: returned by broker: 312 NO_ROUTE
	// message 3: publish: invalid message: body is 33554432 bytes, more than MaxMessageSize 16777216
}
