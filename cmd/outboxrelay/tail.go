package main

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outboxrelay/internal/cli"
	"github.com/outboxrelay/outboxrelay/internal/redact"
)

// TailCmd binds a temporary queue to an exchange and prints every message
// that arrives on it: a way to watch the relay's events without writing a
// consumer. The queue is exclusive and auto-deleted, so nothing is left on
// the broker when it stops, and it takes copies: consumers of the
// exchange's other queues lose nothing.
type TailCmd struct {
	AMQPURL string `name:"amqp-url" env:"AMQP_URL" default:"amqp://localhost:5672/" help:"RabbitMQ URL, or several separated by commas, tried in turn."`
	AMQPTLS
	Exchange   string `name:"exchange" env:"OUTBOX_EXCHANGE" default:"outbox" help:"Exchange to watch; it must exist (the relay declares it when it starts)."`
	BindingKey string `name:"binding-key" default:"#" help:"Binding key of the temporary queue: # takes everything a topic exchange routes; a direct exchange needs an exact routing key, a fanout one ignores it."`
	Count      int    `name:"count" help:"Exit after this many messages (default 0: until interrupted)."`
	JSON       bool   `name:"json" help:"Print one JSON object per message instead of text."`
}

// tailReadyMessage is printed on stderr once the queue is bound: from then
// on every message routed to the exchange is printed.
const tailReadyMessage = "bound a temporary queue; waiting for messages (Ctrl-C stops)"

// Run prints messages until ctx ends or Count have arrived.
func (c TailCmd) Run(ctx context.Context, stdout, stderr io.Writer) error {
	if c.Count < 0 {
		return cli.Usagef("--count %d: must be 0 or more", c.Count)
	}
	tlsConfig, err := c.AMQPTLS.config(c.AMQPURL)
	if err != nil {
		return cli.Usage(err)
	}
	conn, err := c.dial(tlsConfig)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("tail: open channel: %w", err)
	}
	if err := ch.ExchangeDeclarePassive(c.Exchange, "topic", true, false, false, false, nil); err != nil {
		var amqpErr *amqp.Error
		if errors.As(err, &amqpErr) && amqpErr.Code == amqp.NotFound {
			return cli.Usagef("--exchange %q: no such exchange on the broker: start the relay (it declares its exchange) or name another", c.Exchange)
		}
		return fmt.Errorf("tail: check exchange %q: %w", c.Exchange, err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return fmt.Errorf("tail: declare queue: %w", err)
	}
	if err := ch.QueueBind(q.Name, c.BindingKey, c.Exchange, false, nil); err != nil {
		return fmt.Errorf("tail: bind queue to %q with %q: %w", c.Exchange, c.BindingKey, err)
	}
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		return fmt.Errorf("tail: consume: %w", err)
	}
	fmt.Fprintf(stderr, "outboxrelay tail: exchange %q, binding key %q: %s\n", c.Exchange, c.BindingKey, tailReadyMessage)
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	for n := 0; c.Count == 0 || n < c.Count; n++ {
		select {
		case <-ctx.Done():
			return nil
		case err := <-closed:
			return fmt.Errorf("tail: connection closed: %w", err)
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("tail: the broker cancelled the consumer")
			}
			if err := c.print(stdout, d); err != nil {
				return fmt.Errorf("tail: write: %w", err)
			}
		}
	}
	return nil
}

// dial connects to the first URL of AMQPURL that answers. An error never
// carries a password: it is a usage error naming the flag.
func (c TailCmd) dial(tlsConfig *tls.Config) (*amqp.Connection, error) {
	var errs []error
	for _, raw := range strings.Split(c.AMQPURL, ",") {
		raw = strings.TrimSpace(raw)
		conn, err := amqp.DialConfig(raw, amqp.Config{TLSClientConfig: tlsConfig, Heartbeat: 10 * time.Second, Properties: amqp.Table{"connection_name": "outboxrelay tail"}})
		if err == nil {
			return conn, nil
		}
		errs = append(errs, redact.Error(err, raw))
	}
	return nil, cli.Usagef("--amqp-url / AMQP_URL: %w", errors.Join(errs...))
}

// tailMessage is what tail prints of a message.
type tailMessage struct {
	Exchange    string         `json:"exchange"`
	RoutingKey  string         `json:"routing_key"`
	MessageID   string         `json:"message_id,omitempty"`
	Type        string         `json:"type,omitempty"`
	Timestamp   *time.Time     `json:"timestamp,omitempty"`
	ContentType string         `json:"content_type,omitempty"`
	Headers     map[string]any `json:"headers,omitempty"`
	// Body is the body as JSON when it is JSON, otherwise as a string when
	// it is UTF-8 text; BodyBase64 holds any other body.
	Body       any    `json:"body,omitempty"`
	BodyBase64 string `json:"body_base64,omitempty"`
}

func newTailMessage(d amqp.Delivery) tailMessage {
	m := tailMessage{Exchange: d.Exchange, RoutingKey: d.RoutingKey, MessageID: d.MessageId, Type: d.Type,
		ContentType: d.ContentType, Headers: d.Headers}
	if !d.Timestamp.IsZero() {
		ts := d.Timestamp.UTC()
		m.Timestamp = &ts
	}
	switch {
	case json.Valid(d.Body) && len(d.Body) > 0:
		m.Body = json.RawMessage(d.Body)
	case utf8.Valid(d.Body):
		m.Body = string(d.Body)
	default:
		m.BodyBase64 = base64.StdEncoding.EncodeToString(d.Body)
	}
	return m
}

func (c TailCmd) print(w io.Writer, d amqp.Delivery) error {
	m := newTailMessage(d)
	if c.JSON {
		return json.NewEncoder(w).Encode(m)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", m.Exchange, m.RoutingKey)
	for _, kv := range [][2]string{{"message_id", m.MessageID}, {"type", m.Type}, {"content_type", m.ContentType}} {
		if kv[1] != "" {
			fmt.Fprintf(&b, " %s=%s", kv[0], kv[1])
		}
	}
	if m.Timestamp != nil {
		fmt.Fprintf(&b, " timestamp=%s", m.Timestamp.Format(time.RFC3339))
	}
	b.WriteString("\n")
	keys := make([]string, 0, len(m.Headers))
	for k := range m.Headers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "  %s: %v\n", k, m.Headers[k])
	}
	switch body := m.Body.(type) {
	case json.RawMessage:
		fmt.Fprintf(&b, "  %s\n", body)
	case string:
		fmt.Fprintf(&b, "  %q\n", body)
	default:
		fmt.Fprintf(&b, "  base64:%s\n", m.BodyBase64)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
