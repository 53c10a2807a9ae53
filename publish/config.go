package publish

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/outboxrelay/outboxrelay/internal/redact"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// maxShortString is the AMQP limit on exchange names, routing keys, message
// ids, types and header keys (a shortstr).
const maxShortString = 255

// Config configures a Publisher. The zero value is usable: every field
// documents its default.
type Config struct {
	// URL is the broker, amqp:// or amqps://, or several separated by
	// commas, such as the nodes of a cluster: every connect, the first and
	// each reconnect, tries them in turn until one answers, starting after
	// the one it was last connected to. Credentials may be in them and are
	// never logged or returned in errors. Default "amqp://127.0.0.1:5672/"
	// (amqp091 then logs in as guest/guest).
	URL string
	// Exchange receives every message whose Exchange is empty. Default
	// "outbox".
	Exchange string
	// SkipDeclare leaves Exchange alone at connect. By default (false) it is
	// declared at every (re)connect as a durable topic exchange; with
	// SkipDeclare it must already exist.
	SkipDeclare bool
	// ConfirmTimeout bounds a batch: checking its exchanges, getting a
	// channel, sending it and receiving every confirmation. It is renewed
	// while the batch makes progress: when it passes with no message of
	// the batch sent or confirmed since it was set, the batch fails (one
	// to two ConfirmTimeouts after its last progress), so a broker that
	// confirms slowly but steadily is waited for rather than sent the
	// batch again. Messages unconfirmed then fail and their channel is
	// discarded. It also
	// bounds each socket write, so a stalled connection is torn down and
	// reconnected. Neither clock runs while the broker blocks the
	// connection (a resource alarm): then a batch waits, and the
	// connection is watched by its heartbeats alone. Default 15s.
	ConfirmTimeout time.Duration
	// MaxMessageSize is the largest body, in bytes, a message may have;
	// larger ones fail with ErrInvalid before anything is sent. Default
	// 16 MiB.
	MaxMessageSize int
	// Heartbeat is the AMQP heartbeat interval; a connection silent for
	// about three intervals is considered dead. Default 10s.
	Heartbeat time.Duration
	// DialTimeout bounds one connection attempt: TCP, TLS and the AMQP
	// handshake. Default 10s.
	DialTimeout time.Duration
	// ReconnectMin is the first delay between reconnection attempts; it
	// doubles (jittered by ±50%) after each failure. Default 100ms.
	ReconnectMin time.Duration
	// ReconnectMax caps the delay between reconnection attempts, which go
	// on until Run's context ends. Default 5s.
	ReconnectMax time.Duration
	// Tracer, if set, gets one PRODUCER span per message, from its publish
	// to its confirm, a child of the trace context in the message's
	// headers; the span's own context then replaces it in the headers, for
	// consumers to continue. Default nil: no spans, and no cost.
	Tracer trace.Tracer
	// Propagator reads and writes the trace context in the headers.
	// Default: W3C Trace Context (traceparent, tracestate).
	Propagator propagation.TextMapPropagator
	// TLS configures amqps:// connections. Default: nil, which for amqps://
	// means the system roots and the URL's host as server name.
	TLS *tls.Config
	// Logger receives the publisher's logs, with component=publish. Default:
	// discarded.
	Logger *slog.Logger
	// Clock makes the timer of a batch's deadline (ConfirmTimeout).
	// Default: the system clock.
	Clock Clock
}

func (c Config) withDefaults() Config {
	c.URL = cmp.Or(c.URL, "amqp://127.0.0.1:5672/")
	c.Exchange = cmp.Or(c.Exchange, "outbox")
	c.ConfirmTimeout = cmp.Or(c.ConfirmTimeout, 15*time.Second)
	c.MaxMessageSize = cmp.Or(c.MaxMessageSize, 16<<20)
	c.Heartbeat = cmp.Or(c.Heartbeat, 10*time.Second)
	c.DialTimeout = cmp.Or(c.DialTimeout, 10*time.Second)
	c.ReconnectMin = cmp.Or(c.ReconnectMin, 100*time.Millisecond)
	c.ReconnectMax = cmp.Or(c.ReconnectMax, 5*time.Second)
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.Clock == nil {
		c.Clock = systemClock{}
	}
	return c
}

// Validate reports the first setting that cannot work, naming it, as a
// *ConfigError. It never includes the URL's password.
func (c Config) Validate() error {
	c = c.withDefaults()
	urls := c.urls()
	if len(urls) == 0 {
		return configErrorf("URL", "publish: URL: no URL in the list")
	}
	for i, u := range urls {
		label := "URL"
		if len(urls) > 1 {
			label = fmt.Sprintf("URL %d of %d", i+1, len(urls))
		}
		if err := validateURL(label, u); err != nil {
			return &ConfigError{Setting: "URL", Err: err}
		}
	}
	switch {
	case len(c.Exchange) > maxShortString:
		return configErrorf("Exchange", "publish: Exchange is %d bytes: at most %d", len(c.Exchange), maxShortString)
	case c.ConfirmTimeout <= 0:
		return configErrorf("ConfirmTimeout", "publish: ConfirmTimeout %s: must be positive", c.ConfirmTimeout)
	case c.MaxMessageSize <= 0:
		return configErrorf("MaxMessageSize", "publish: MaxMessageSize %d: must be positive", c.MaxMessageSize)
	case c.Heartbeat < time.Second:
		return configErrorf("Heartbeat", "publish: Heartbeat %s: must be at least 1s", c.Heartbeat)
	case c.DialTimeout <= 0:
		return configErrorf("DialTimeout", "publish: DialTimeout %s: must be positive", c.DialTimeout)
	case c.ReconnectMin <= 0:
		return configErrorf("ReconnectMin", "publish: ReconnectMin %s: must be positive", c.ReconnectMin)
	case c.ReconnectMax < c.ReconnectMin:
		return configErrorf("ReconnectMax", "publish: ReconnectMax %s: must be at least ReconnectMin (%s)", c.ReconnectMax, c.ReconnectMin)
	}
	return nil
}

// validateURL checks the URL without ever echoing it: url.Parse's errors
// quote the whole input, password included.
func validateURL(label, raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return fmt.Errorf("publish: %s: %w (reserved characters in the user or password must be percent-encoded)", label, err)
	}
	if u.Scheme != "amqp" && u.Scheme != "amqps" {
		return fmt.Errorf("publish: %s %s: scheme must be amqp or amqps", label, redact.URL(raw))
	}
	if _, err := amqp.ParseURI(raw); err != nil {
		return fmt.Errorf("publish: %s %s: %w", label, redact.URL(raw), redact.Error(err, raw))
	}
	return nil
}

// urls splits URL into its list: comma-separated, spaces around each
// trimmed, empty entries dropped.
func (c Config) urls() []string {
	var out []string
	for _, u := range strings.Split(c.URL, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, u)
		}
	}
	return out
}

// ConfigError is the error Validate returns: the setting that cannot work,
// and why. Its text names the setting too.
type ConfigError struct {
	// Setting is the Config field, as Go spells it: "URL" (for any URL of
	// the list), "Exchange", "ConfirmTimeout", and so on.
	Setting string
	Err     error
}

func (e *ConfigError) Error() string { return e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

// configErrorf returns a *ConfigError of setting with the formatted text.
func configErrorf(setting, format string, args ...any) error {
	return &ConfigError{Setting: setting, Err: fmt.Errorf(format, args...)}
}
