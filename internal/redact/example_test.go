package redact_test

import (
	"errors"
	"fmt"
	"os"

	"github.com/outboxrelay/outboxrelay/internal/redact"
)

func ExampleURL() {
	fmt.Println(redact.URL("amqp://guest:secret@rabbit:5672/"))
	fmt.Println(redact.URL("amqp://guest:secret@a:5672/,amqp://guest:secret@b:5672/"))
	fmt.Println(redact.URL("postgres://app@db:5432/app"))
	fmt.Println(redact.URL("postgres://app@db:5432/app?password=secret&sslmode=disable"))
	fmt.Println(redact.URL("host=db user=app password='a secret' sslmode=disable"))
	fmt.Println(redact.URL("db:5432"))
	// Output:
	// amqp://guest:xxxxx@rabbit:5672/
	// amqp://guest:xxxxx@a:5672/,amqp://guest:xxxxx@b:5672/
	// postgres://app@db:5432/app
	// postgres://app@db:5432/app?password=xxxxx&sslmode=disable
	// host=db user=app password=xxxxx sslmode=disable
	// (unparsable URL)
}

func ExampleError() {
	raw := "postgres://app:s%23cret@db:5432/app"
	err := fmt.Errorf("connect with password s#cret: %w", os.ErrDeadlineExceeded)
	err = redact.Error(err, raw)
	fmt.Println(err)
	fmt.Println(errors.Is(err, os.ErrDeadlineExceeded))
	// Output:
	// connect with password xxxxx: i/o timeout
	// true
}
