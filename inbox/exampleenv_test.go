package inbox_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
)

// exampleEnv is what the examples run against: a database of their own
// with the relay's outbox table, and a queue whose dead-letter exchange
// exists, all removed by close.
type exampleEnv struct {
	databaseURL, amqpURL string
	queue, dlx           string
	conn                 *amqp.Connection
	ch                   *amqp.Channel
	drop                 func() error
}

func newExampleEnv(ctx context.Context) (_ *exampleEnv, err error) {
	databaseURL, drop, err := createDatabase(ctx)
	if err != nil {
		return nil, err
	}
	e := &exampleEnv{databaseURL: databaseURL, amqpURL: amqpURL(), queue: uniqueName("inbox-example"), drop: drop}
	e.dlx = e.queue + "-dlx"
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if err := applyRelayMigrations(ctx, databaseURL); err != nil {
		return nil, err
	}
	if e.conn, err = amqp.Dial(e.amqpURL); err != nil {
		return nil, err
	}
	if e.ch, err = e.conn.Channel(); err != nil {
		return nil, err
	}
	if err := e.ch.ExchangeDeclare(e.dlx, "fanout", false, true, false, false, nil); err != nil {
		return nil, err
	}
	if _, err := e.ch.QueueDeclare(e.queue, true, false, false, false, amqp.Table{"x-dead-letter-exchange": e.dlx}); err != nil {
		return nil, err
	}
	return e, e.ch.Confirm(false)
}

// publish publishes a persistent message with message id id to the queue,
// as the relay does, and waits for the broker's confirm.
func (e *exampleEnv) publish(ctx context.Context, id, body string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	dc, err := e.ch.PublishWithDeferredConfirmWithContext(ctx, "", e.queue, false, false, amqp.Publishing{
		MessageId: id, ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: []byte(body),
	})
	if err != nil {
		return err
	}
	if ok, err := dc.WaitContext(ctx); err != nil || !ok {
		return cmp.Or(err, errors.New("publish nacked"))
	}
	return nil
}

func (e *exampleEnv) close() {
	if e.ch != nil {
		_, _ = e.ch.QueueDelete(e.queue, false, false, false)
		_ = e.ch.ExchangeDelete(e.dlx, false, false)
	}
	if e.conn != nil {
		_ = e.conn.Close()
	}
	if err := e.drop(); err != nil {
		fmt.Println(err)
	}
}

// relayMigrations holds the relay's migrations, "<number>_<name>.sql",
// applied in order: the outbox table the producer library writes to. They
// are read as files (the inbox module uses none of the relay's code) and
// applied as the producer library's tests apply them.
const relayMigrations = "../migrations"

var migrationFile = regexp.MustCompile(`\A(\d+)_.+\.sql\z`)

func applyRelayMigrations(ctx context.Context, databaseURL string) error {
	entries, err := os.ReadDir(relayMigrations)
	if err != nil {
		return fmt.Errorf("read the relay's migrations: %w", err)
	}
	type migration struct {
		number int
		name   string
	}
	var migrations []migration
	for _, e := range entries {
		if m := migrationFile.FindStringSubmatch(e.Name()); m != nil && !e.IsDir() {
			n, err := strconv.Atoi(m[1])
			if err != nil {
				return fmt.Errorf("migration %s: %w", e.Name(), err)
			}
			migrations = append(migrations, migration{n, e.Name()})
		}
	}
	slices.SortFunc(migrations, func(a, b migration) int { return cmp.Compare(a.number, b.number) })
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for _, m := range migrations {
		body, err := os.ReadFile(filepath.Join(relayMigrations, m.name))
		if err != nil {
			return err
		}
		up, _, _ := strings.Cut(string(body), "---- create above / drop below ----")
		if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, up)
			return err
		}); err != nil {
			return fmt.Errorf("migration %s: %w", m.name, err)
		}
	}
	return nil
}
