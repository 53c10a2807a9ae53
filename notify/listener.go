package notify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgxlisten"

	"github.com/outboxrelay/outboxrelay/internal/redact"
)

// Listener LISTENs on its own connection and turns notifications into
// wake-ups on C. Create it with New and drive it with Run.
type Listener struct {
	cfg         Config
	connConfig  *pgx.ConnConfig
	pingChannel string // the heartbeat's private channel; "" without a Pinger
	log         *slog.Logger
	wake        chan struct{}
	signals     atomic.Uint64 // wake-ups signalled, see Signals
	requeues    atomic.Uint64 // requeue notifications, see Requeues
	running     atomic.Bool
	// listening is set once LISTEN succeeds and cleared when the
	// connection is lost or abandoned (see Connected).
	listening atomic.Bool
	// holdsLock is set while the listening connection holds the listen
	// lock (listenlock.go), cleared with each new connection.
	holdsLock atomic.Bool
	// instance is the id of the instance lock the listening connection
	// holds (instance.go), 0 from the moment the connection is found lost.
	instance atomic.Uint32

	// The heartbeat: the watchdog sends sequence number pingSeq through the
	// Pinger; the listening connection records the highest number it got
	// back in pongSeq and signals pong.
	pingSeq atomic.Uint64
	pongSeq atomic.Uint64
	pong    chan struct{}

	// Owned by the goroutine running Run: pgxlisten calls connect and the
	// handlers from there, one session after the other.
	backoff  *backoff.ExponentialBackOff
	attempts int         // failed connect attempts since LISTEN last succeeded
	waitNext bool        // the next connect attempt waits for the backoff first
	listened bool        // LISTEN succeeded before: the next success is a reconnect
	conns    []*pgx.Conn // connections pgx may still be closing; Run awaits them

	// Notifications handled on Channel (the heartbeat rests while they
	// come), and, for tests, a hook called after every successful LISTEN
	// with the backend's pid.
	notified    atomic.Int64
	onListening func(pid uint32)
}

// New checks cfg, fills in its defaults and returns a Listener that is not
// yet connected.
func New(cfg Config) (*Listener, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	l := &Listener{
		cfg:        cfg,
		connConfig: listenerConnConfig(cfg.ConnConfig),
		log:        cfg.Logger.With("component", "notify"),
		wake:       make(chan struct{}, 1),
		pong:       make(chan struct{}, 1),
		backoff: backoff.NewExponentialBackOff(
			backoff.WithInitialInterval(cfg.ReconnectMin),
			backoff.WithMaxInterval(cfg.ReconnectMax),
			backoff.WithMaxElapsedTime(0),
		),
	}
	if cfg.Pinger != nil {
		l.pingChannel = pingChannel(cfg.Channel)
	}
	return l, nil
}

// C delivers wake-ups: once when Run starts, after every successful
// (re)connect, and on notifications on Channel. It has room for one
// wake-up and sends never block, so a burst of notifications that arrives
// while the receiver is busy is a single wake-up. A wake-up means "look at
// the table", nothing more.
func (l *Listener) C() <-chan struct{} { return l.wake }

// Signals counts the wake-ups signalled so far, whether C delivered each
// or folded it into one already pending. A wake-up is signalled only once
// its notification has been read off the connection, so a look at the
// table begun after Signals returned n covers the first n: a receiver that
// reads Signals just before it looks can tell, when it takes a wake-up
// later, whether a look since then already covers it. That spares the
// look that finds nothing when notifications arrive together and C hands
// each one to another waiting receiver.
func (l *Listener) Signals() uint64 { return l.signals.Load() }

// RequeuePayload is the payload of the notification outboxrelay requeue
// sends: dead letters were put back to pending, which a relay claiming
// above its floor (claim.Store.Advance) looks for below it. The trigger's
// notifications carry none.
const RequeuePayload = "requeue"

// Requeues counts the notifications on Channel that carried
// RequeuePayload, each counted before the wake-up it causes.
func (l *Listener) Requeues() uint64 { return l.requeues.Load() }

// Connected reports whether the listener is LISTENing on Channel now: set
// once LISTEN succeeds, cleared as soon as the connection is found lost
// (by pgx, or by the heartbeat within PingInterval + PingTimeout).
func (l *Listener) Connected() bool { return l.listening.Load() }

// Run listens until ctx is cancelled, reconnecting as often as needed, and
// then returns nil. A connection failure is never returned: it is logged
// and retried. Calling Run while another call is running returns an error.
func (l *Listener) Run(ctx context.Context) error {
	if !l.running.CompareAndSwap(false, true) {
		return errors.New("notify: run: already running")
	}
	defer l.running.Store(false)

	l.log.Debug("listener starting", "channel", l.cfg.Channel,
		"host", l.connConfig.Host, "database", l.connConfig.Database, "heartbeat", l.pingChannel != "")
	l.signal() // a first pass, whatever the state of the connection

	for ctx.Err() == nil {
		l.runSession(ctx)
	}
	// pgx may still be closing a connection in the background; leave
	// nothing behind. (Quick: see dial and session.abandon.)
	for _, conn := range l.conns {
		<-conn.PgConn().CleanupDone()
	}
	l.conns = nil
	l.log.Debug("listener stopped")
	return nil
}

// runSession runs pgxlisten until ctx is cancelled or the watchdog finds the
// listening connection dead. pgxlisten reconnects on its own within a
// session; a new session is needed only to abandon a connection that hangs.
func (l *Listener) runSession(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := &session{l: l, cancel: cancel}

	pl := &pgxlisten.Listener{
		Connect:        s.connect,
		LogError:       s.logError,
		ReconnectDelay: -1, // connect does the waiting, with backoff
	}
	pl.Handle(l.cfg.Channel, channelHandler{s})
	if l.pingChannel != "" {
		pl.Handle(l.pingChannel, pgxlisten.HandlerFunc(l.handlePong))
	}

	var wg sync.WaitGroup
	if l.cfg.Pinger != nil {
		wg.Go(func() { s.watchdog(ctx) })
	}
	_ = pl.Listen(ctx) // returns only once ctx is done
	s.abandon()
	wg.Wait()
}

// signal counts a wake-up and sends it unless one is already pending.
func (l *Listener) signal() {
	l.signals.Add(1)
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// errNoCancelRequest refuses pgx's cancel requests on the listening
// connection.
var errNoCancelRequest = errors.New("notify: no cancel requests on the listening connection")

// dial opens the listening connection and, with a heartbeat, LISTENs on the
// private ping channel, all within ConnectTimeout. pgxlisten LISTENs on
// Channel afterwards.
//
// When a call on a connection is interrupted, pgx closes it in the
// background and first sends PostgreSQL a cancel request over a new
// connection, waiting up to 15 seconds for it: forever, as far as a relay
// behind a silent partition is concerned. The listener never runs anything
// worth cancelling, so once connected its dialer refuses further dials.
func (l *Listener) dial(ctx context.Context) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.ConnectTimeout)
	defer cancel()

	l.conns = slices.DeleteFunc(l.conns, func(c *pgx.Conn) bool {
		select {
		case <-c.PgConn().CleanupDone():
			return true
		default:
			return false
		}
	})

	cc := l.connConfig.Copy()
	var connected atomic.Bool
	dialFunc := cc.DialFunc
	cc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if connected.Load() {
			return nil, errNoCancelRequest
		}
		return dialFunc(ctx, network, addr)
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("notify: connect: %w", err)
	}
	connected.Store(true)
	l.conns = append(l.conns, conn)

	if l.pingChannel != "" {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.pingChannel}.Sanitize()); err != nil {
			_ = conn.Close(ctx)
			_ = conn.PgConn().Conn().Close() // unblock pgx's background close
			return nil, fmt.Errorf("notify: listen %q: %w", l.pingChannel, err)
		}
	}
	return conn, nil
}

// errAttr is the "err" log attribute for err, with the connection's
// secrets masked should any error ever quote them: those of its
// connection string, and the password wherever it came from.
func (l *Listener) errAttr(err error) slog.Attr {
	err = redact.Error(err, l.connConfig.ConnString())
	if pw := l.connConfig.Password; pw != "" {
		conn := url.URL{Scheme: "postgres", User: url.UserPassword(l.connConfig.User, pw), Host: l.connConfig.Host}
		err = redact.Error(err, conn.String())
	}
	return slog.Any("err", err)
}

// session is one run of pgxlisten.Listener.Listen, under a context the
// watchdog cancels (see abandon) when the listening connection stops
// answering.
type session struct {
	l      *Listener
	cancel context.CancelFunc

	mu   sync.Mutex
	conn net.Conn // the open connection's socket; nil while (re)connecting
	gen  uint64   // counts connections, so a late verdict spares a new one
}

// setConn records the socket of a new connection, or nil while there is
// none.
func (s *session) setConn(conn net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conn = conn
	if conn != nil {
		s.gen++
	}
}

// current reports which connection is open, if any.
func (s *session) current() (gen uint64, connected bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen, s.conn != nil
}

// abandon ends the session and closes the socket under the open
// connection, if any. Cancelling the context interrupts pgx at once;
// closing the socket also ends pgx's background close of an interrupted
// connection, which would otherwise wait on a silent peer.
func (s *session) abandon() {
	s.l.listening.Store(false)
	s.l.instance.Store(0)
	s.cancel()
	s.mu.Lock()
	conn := s.conn
	s.conn = nil
	s.mu.Unlock()
	if conn != nil {
		_ = conn.Close()
	}
}

// connectError marks a connect failure that connect has logged already.
type connectError struct{ err error }

func (e *connectError) Error() string { return e.err.Error() }
func (e *connectError) Unwrap() error { return e.err }

// connect is pgxlisten's Connect: it waits for the backoff (except on the
// very first attempt), then dials.
func (s *session) connect(ctx context.Context) (*pgx.Conn, error) {
	l := s.l
	s.setConn(nil)
	l.listening.Store(false)
	l.holdsLock.Store(false)
	l.instance.Store(0)
	if l.waitNext {
		d := l.backoff.NextBackOff()
		l.log.Debug("listener reconnecting", "delay", d)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
	l.waitNext = true

	conn, err := l.dial(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		l.attempts++
		l.log.Warn("listener connect failed", "attempt", l.attempts, l.errAttr(err))
		return nil, &connectError{err}
	}
	s.setConn(conn.PgConn().Conn())
	return conn, nil
}

// logError is pgxlisten's LogError.
func (s *session) logError(ctx context.Context, err error) {
	l := s.l
	// The connection is gone (pgxlisten reconnects next): so is its
	// instance lock, whatever the server still holds.
	l.instance.Store(0)
	var logged *connectError
	switch {
	case ctx.Err() != nil:
		l.log.Debug("listener session ended", l.errAttr(err))
	case errors.As(err, &logged):
	default:
		l.log.Warn("listener connection failed, reconnecting", l.errAttr(fmt.Errorf("notify: %w", err)))
	}
}

// channelHandler handles Channel: it wakes on every notification and, as a
// pgxlisten.BacklogHandler, after every successful LISTEN, the moment rows
// inserted while disconnected must be claimed; then it also takes the
// listen lock.
type channelHandler struct{ s *session }

func (h channelHandler) HandleNotification(_ context.Context, n *pgconn.Notification, _ *pgx.Conn) error {
	if n.Payload == RequeuePayload {
		h.s.l.requeues.Add(1) // before the wake-up, which finds it counted
	}
	h.s.l.signal()
	h.s.l.notified.Add(1) // after the signal: a test that saw the count sees its wake-up
	return nil
}

func (h channelHandler) HandleBacklog(ctx context.Context, channel string, conn *pgx.Conn) error {
	l := h.s.l
	// The instance lock first, so that the claims the wake-up brings carry
	// the new id. LISTEN first, then the listen lock: a producer that finds
	// a relay listening notifies a connection that receives it. The
	// wake-up follows the lock, whose taking waited for the producers that
	// did not notify.
	l.takeInstanceLock(ctx, conn)
	l.takeListenLock(ctx, conn)
	l.signal()
	l.backoff.Reset()
	pid := conn.PgConn().PID()
	if l.listened {
		l.log.Info("listener reconnected", "channel", channel, "pid", pid, "failed_attempts", l.attempts)
	} else {
		l.log.Info("listener connected", "channel", channel, "pid", pid)
	}
	l.listened = true
	l.listening.Store(true)
	l.attempts = 0
	if l.onListening != nil {
		l.onListening(pid)
	}
	return nil
}
