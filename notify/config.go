package notify

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"reflect"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ApplicationName is the application_name the listener's connection reports
// in pg_stat_activity, unless ConnConfig.RuntimeParams already names one.
const ApplicationName = "outboxrelay-listener"

// maxChannelBytes is PostgreSQL's identifier limit (NAMEDATALEN - 1).
const maxChannelBytes = 63

// Defaults for the zero values of Config.
const (
	DefaultChannel        = "outbox"
	DefaultReconnectMin   = 100 * time.Millisecond
	DefaultReconnectMax   = 5 * time.Second
	DefaultConnectTimeout = 10 * time.Second
	DefaultPingInterval   = 30 * time.Second
	DefaultPingTimeout    = 5 * time.Second
)

// TCP keepalive on the listener's socket: a peer that vanished is noticed
// after about Idle + Interval*Count of silence.
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3}

// Execer runs a statement on a connection other than the listener's; a
// *pgxpool.Pool satisfies it. It must be safe for concurrent use.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Config configures a Listener. Only ConnConfig is required; every zero
// value is replaced by the default its comment names.
type Config struct {
	// ConnConfig says where to connect. Required. The Listener works on a
	// copy: it sets application_name to ApplicationName unless RuntimeParams
	// already has one, and it dials with TCP keepalive (idle 15s, interval
	// 5s, 3 probes) unless DialFunc is something other than pgx's default
	// (a custom DialFunc is kept as it is). Build it with pgx.ParseConfig.
	// LISTEN needs a session of its own: connect to PostgreSQL directly or
	// through a session-mode pooler, never a transaction-mode one.
	ConnConfig *pgx.ConnConfig

	// Channel is the channel the outbox trigger NOTIFYs. It is quoted
	// exactly as given, so it is case-sensitive: an unquoted NOTIFY outbox
	// in SQL is the channel "outbox". At most 63 bytes. Default "outbox".
	Channel string

	// ReconnectMin and ReconnectMax are the first and the largest interval
	// of the exponential backoff between connect attempts; each wait is
	// jittered by ±50% and the backoff never gives up. The first attempt of
	// Run is immediate; after a connection is lost the next one waits about
	// ReconnectMin, as the backoff resets whenever LISTEN succeeds.
	// Defaults 100ms and 5s (or ReconnectMin, if that is larger).
	ReconnectMin, ReconnectMax time.Duration

	// ConnectTimeout bounds one connect attempt: dialing, authenticating
	// and the heartbeat channel's LISTEN. Default 10s.
	ConnectTimeout time.Duration

	// PingInterval is how often the heartbeat proves the listening
	// connection alive. An interval in which the connection delivered a
	// notification on Channel needs no heartbeat and sends none: producers
	// that notify are not made to queue behind the heartbeat's NOTIFY.
	// Default 30s. Only used when Pinger is set.
	PingInterval time.Duration

	// PingTimeout is how long a heartbeat may take to come back on the
	// listening connection before that connection is considered dead and
	// replaced. Default 5s. Only used when Pinger is set.
	PingTimeout time.Duration

	// Pinger sends the heartbeat, SELECT pg_notify(<private channel>,
	// <sequence number>), over another connection, for example the
	// relay's *pgxpool.Pool. Optional: if nil there is no heartbeat, and a
	// silently dead connection is only noticed by TCP keepalive (which a
	// proxy or load balancer in between may defeat).
	Pinger Execer

	// Instance, if set, has the listener hold an instance lock on each
	// listening connection, under an id drawn for that connection, for as
	// long as the connection lives (see Listener.Instance): the relay
	// stamps the id on its claims, and other relays take those claims'
	// rows over once the lock is gone. Default false.
	Instance bool

	// Logger receives the Listener's logs, with component=notify. Default:
	// logs are discarded.
	Logger *slog.Logger
}

// withDefaults returns c with every zero value replaced by its default.
func (c Config) withDefaults() Config {
	c.Channel = cmp.Or(c.Channel, DefaultChannel)
	c.ReconnectMin = cmp.Or(c.ReconnectMin, DefaultReconnectMin)
	c.ReconnectMax = cmp.Or(c.ReconnectMax, max(DefaultReconnectMax, c.ReconnectMin))
	c.ConnectTimeout = cmp.Or(c.ConnectTimeout, DefaultConnectTimeout)
	c.PingInterval = cmp.Or(c.PingInterval, DefaultPingInterval)
	c.PingTimeout = cmp.Or(c.PingTimeout, DefaultPingTimeout)
	c.Logger = cmp.Or(c.Logger, slog.New(slog.DiscardHandler))
	return c
}

// Validate reports the first problem with c, after defaults are applied,
// naming the offending field.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.ConnConfig == nil:
		return errors.New("notify: ConnConfig is required")
	case len(c.Channel) > maxChannelBytes:
		return fmt.Errorf("notify: Channel %q is %d bytes, longer than PostgreSQL's %d", c.Channel, len(c.Channel), maxChannelBytes)
	case c.ReconnectMin < 0:
		return fmt.Errorf("notify: ReconnectMin %s is negative", c.ReconnectMin)
	case c.ReconnectMax < c.ReconnectMin:
		return fmt.Errorf("notify: ReconnectMax %s is less than ReconnectMin %s", c.ReconnectMax, c.ReconnectMin)
	case c.ConnectTimeout < 0:
		return fmt.Errorf("notify: ConnectTimeout %s is negative", c.ConnectTimeout)
	case c.PingInterval < 0:
		return fmt.Errorf("notify: PingInterval %s is negative", c.PingInterval)
	case c.PingTimeout < 0:
		return fmt.Errorf("notify: PingTimeout %s is negative", c.PingTimeout)
	}
	return nil
}

// listenerConnConfig returns the copy of cc the listener connects with.
func listenerConnConfig(cc *pgx.ConnConfig) *pgx.ConnConfig {
	cc = cc.Copy()
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = make(map[string]string)
	}
	if _, ok := cc.RuntimeParams["application_name"]; !ok {
		cc.RuntimeParams["application_name"] = ApplicationName
	}
	if cc.DialFunc == nil || isNetDialer(cc.DialFunc) {
		// pgx.ParseConfig always sets DialFunc to a plain net.Dialer's
		// DialContext (with connect_timeout, if given); replace it by one
		// that also enables keepalive.
		d := &net.Dialer{Timeout: cc.ConnectTimeout, KeepAliveConfig: keepAlive}
		cc.DialFunc = d.DialContext
	}
	return cc
}

// isNetDialer reports whether f is the DialContext method of some
// *net.Dialer, which is what pgx.ParseConfig installs. A user's own
// function has a different code pointer and is kept.
func isNetDialer(f pgconn.DialFunc) bool {
	return reflect.ValueOf(f).Pointer() == reflect.ValueOf((&net.Dialer{}).DialContext).Pointer()
}
