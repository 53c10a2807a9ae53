package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/outboxrelay/outboxrelay/internal/redact"
	amqp "github.com/rabbitmq/amqp091-go"
)

// closeTimeout bounds the connection.close handshake on shutdown.
const closeTimeout = 5 * time.Second

// Publisher publishes batches of messages to RabbitMQ with publisher
// confirms. It owns one connection, which Run watches and re-establishes,
// and a pool of confirm channels. It is safe for concurrent use.
type Publisher struct {
	cfg   Config
	log   *slog.Logger
	urls  []string // cfg.URL's list
	names []string // urls without their passwords, for logs and errors
	// at is the index of the URL last connected to (under mu); -1 before
	// the first connect.
	at int

	mu      sync.Mutex
	conn    *amqp.Connection // nil while disconnected
	wire    *coalescingConn  // conn's socket, under TLS if any
	gen     uint64           // bumped at every connect
	connErr chan *amqp.Error // conn's close notification
	blocks  chan amqp.Blocking
	blocked string        // the broker's reason while blocked by a resource alarm
	isBlock bool          // blocked by a resource alarm
	changed chan struct{} // closed and replaced at every state change
	idle    []*channel    // pooled channels, most recently used last
	known   map[string]bool
	closed  bool
	running bool
	stopRun context.CancelFunc // cancels a running Run
	wg      sync.WaitGroup     // returns goroutines, background channel closes

	// deadlines are those of the batches in flight (batchContext); p.mu
	// guards it.
	deadlines map[*batchDeadline]struct{}

	// scratchSem (capacity 1) serialises exchange checks on the scratch
	// channel; p.mu guards the two fields.
	scratchSem chan struct{}
	scratch    *amqp.Channel // for exchange declarations; reopened after a 404
	scratchOf  uint64        // the gen scratch belongs to

	timeout error // the cause of a batch's deadline

	teardownOnce sync.Once
	runDone      chan struct{} // closed when Run returns

	// afterSend, if set (tests), runs once a batch is sent, before its
	// confirmations are awaited.
	afterSend func()
}

// Dial validates cfg, connects once and declares cfg.Exchange (unless
// SkipDeclare). It fails fast: it does not retry, and its error names what
// failed without the URL's password. Call Run to keep the connection up.
func Dial(ctx context.Context, cfg Config) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	p := &Publisher{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "publish"),
		urls:    cfg.urls(),
		at:      -1,
		changed: make(chan struct{}),
		known:   make(map[string]bool),
		runDone: make(chan struct{}),

		deadlines: make(map[*batchDeadline]struct{}),

		scratchSem: make(chan struct{}, 1),
		timeout:    fmt.Errorf("confirm timeout %s: %w", cfg.ConfirmTimeout, context.DeadlineExceeded),
	}
	for _, u := range p.urls {
		p.names = append(p.names, redact.URL(u))
	}
	if err := p.connect(ctx); err != nil {
		return nil, err
	}
	p.log.Info("connected", "url", p.Broker())
	return p, nil
}

// Broker is the URL, without its password, of the broker the publisher is
// connected to, or was last: one of Config.URL's list.
func (p *Publisher) Broker() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.names[max(p.at, 0)]
}

// connect connects to the first of the URLs that answers, trying them in
// turn from the one after the URL last connected to.
func (p *Publisher) connect(ctx context.Context) error {
	p.mu.Lock()
	start := (p.at + 1) % len(p.urls)
	p.mu.Unlock()
	var errs brokerErrors
	for k := range p.urls {
		i := (start + k) % len(p.urls)
		err := p.connectTo(ctx, i)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, ErrClosed):
			return err
		case ctx.Err() != nil:
			return fmt.Errorf("publish: %w", err)
		}
		if len(p.urls) > 1 {
			p.log.Debug("broker did not answer", "url", p.names[i], "err", err)
		}
		errs = append(errs, err)
	}
	if len(errs) == 1 {
		return fmt.Errorf("publish: %w", errs[0])
	}
	return fmt.Errorf("publish: none of %d brokers answered: %w", len(errs), errs)
}

// brokerErrors are the failures of one connect, a URL each.
type brokerErrors []error

func (e brokerErrors) Error() string {
	parts := make([]string, len(e))
	for i, err := range e {
		parts[i] = err.Error()
	}
	return strings.Join(parts, "; ")
}

func (e brokerErrors) Unwrap() []error { return e }

// connectTo dials URL i, declares the exchange and installs the new
// connection.
func (p *Publisher) connectTo(ctx context.Context, i int) (err error) {
	name := p.names[i]
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName("outboxrelay publish")
	var (
		stop func() bool
		wire *coalescingConn
	)
	dial := p.dialer(ctx, &wire)
	conn, err := amqp.DialConfig(p.urls[i], amqp.Config{
		Heartbeat:       p.cfg.Heartbeat,
		TLSClientConfig: p.cfg.TLS.Clone(), // amqp091 sets ServerName on it
		Properties:      props,
		Dial: func(network, addr string) (net.Conn, error) {
			c, err := dial(network, addr)
			if err == nil {
				// Abort the handshake when ctx ends.
				stop = context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
			}
			return c, err
		},
	})
	if stop != nil && !stop() {
		// ctx ended during the handshake; the connection, if any, had its
		// deadline moved to the past.
		if conn != nil {
			_ = conn.Close()
		}
		return fmt.Errorf("connect %s: %w", name, ctx.Err())
	}
	if err != nil {
		return fmt.Errorf("connect %s: %w", name, redact.Error(err, p.urls[i]))
	}
	defer func() {
		if err != nil {
			_ = conn.Close()
		}
	}()
	connErr := conn.NotifyClose(make(chan *amqp.Error, 1))
	blocks := conn.NotifyBlocked(make(chan amqp.Blocking, 8))

	// The handshake deadline is gone; bound the setup round trips by
	// DialTimeout and ctx too, by tearing the connection down under them.
	abort := func() { _ = conn.CloseDeadline(time.Now()) }
	timer := time.AfterFunc(p.cfg.DialTimeout, abort)
	stopAbort := context.AfterFunc(ctx, abort)
	scratch, err := p.setup(conn)
	timedOut, canceled := !timer.Stop(), !stopAbort()
	switch {
	case canceled:
		return fmt.Errorf("connect %s: %w", name, ctx.Err())
	case timedOut:
		return fmt.Errorf("connect %s: setup not done within DialTimeout %s", name, p.cfg.DialTimeout)
	case err != nil:
		return fmt.Errorf("connect %s: %w", name, err)
	}

	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.conn, p.connErr, p.blocks, p.wire = conn, connErr, blocks, wire
	p.at = i
	p.gen++
	p.isBlock, p.blocked = false, ""
	p.idle = nil // channels of an old connection died with it
	p.scratch, p.scratchOf = scratch, p.gen
	if !p.cfg.SkipDeclare {
		p.known[p.cfg.Exchange] = true
	}
	p.changedLocked()
	return nil
}

// setup opens the scratch channel and declares the exchange on it.
func (p *Publisher) setup(conn *amqp.Connection) (*amqp.Channel, error) {
	scratch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	if !p.cfg.SkipDeclare {
		if err := p.declare(scratch); err != nil {
			return nil, fmt.Errorf("declare exchange %q: %w", p.cfg.Exchange, err)
		}
	}
	return scratch, nil
}

// declare declares the default exchange: durable topic. The error is
// amqp091's: each caller says what it was doing.
func (p *Publisher) declare(ch *amqp.Channel) error {
	return ch.ExchangeDeclare(p.cfg.Exchange, amqp.ExchangeTopic, true, false, false, false, nil)
}

// State reports whether the publisher has a connection to the broker now,
// and whether the broker blocks it (a resource alarm): Publish can succeed
// only when connected and not blocked.
func (p *Publisher) State() (connected, blocked bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.conn != nil, p.conn != nil && p.isBlock
}

// changedLocked wakes every WaitReady and updates the deadline of every
// batch in flight. p.mu must be held.
func (p *Publisher) changedLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
	for d := range p.deadlines {
		p.updateDeadlineLocked(d)
	}
}

// Run keeps the connection up until ctx ends or Close is called: it watches
// for connection loss and reconnects with jittered exponential backoff
// (ReconnectMin doubling up to ReconnectMax, forever), re-declaring the
// exchange; it tracks connection.blocked, for WaitReady. When ctx ends it
// closes the connection and the publisher, and returns nil. It returns an
// error only if the publisher is already closed or running.
func (p *Publisher) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p.mu.Lock()
	switch {
	case p.closed:
		p.mu.Unlock()
		return ErrClosed
	case p.running:
		p.mu.Unlock()
		return errors.New("publish: Run called twice")
	}
	p.running, p.stopRun = true, cancel
	p.mu.Unlock()
	defer close(p.runDone)
	defer p.teardown()

	for {
		p.mu.Lock()
		conn, connErr, blocks := p.conn, p.connErr, p.blocks
		p.mu.Unlock()
		if conn == nil {
			if err := p.reconnect(ctx); err != nil {
				return nil // ctx ended or closed
			}
			continue
		}
		if !p.watch(ctx, conn, connErr, blocks) {
			return nil
		}
	}
}

// watch follows one connection until it is lost (true) or ctx ends
// (false).
func (p *Publisher) watch(ctx context.Context, conn *amqp.Connection, connErr <-chan *amqp.Error, blocks <-chan amqp.Blocking) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case b, ok := <-blocks:
			if !ok {
				blocks = nil // closed with the connection; connErr says why
				continue
			}
			p.setBlocked(b)
		case err := <-connErr:
			p.mu.Lock()
			if p.conn == conn {
				p.conn, p.isBlock, p.blocked = nil, false, ""
				p.idle = nil
				p.changedLocked()
			}
			p.mu.Unlock()
			if err != nil {
				p.log.Warn("connection lost", "err", err)
			} else {
				p.log.Warn("connection closed")
			}
			return true
		}
	}
}

func (p *Publisher) setBlocked(b amqp.Blocking) {
	p.mu.Lock()
	changed := p.isBlock != b.Active
	p.isBlock, p.blocked = b.Active, b.Reason
	if p.wire != nil {
		p.wire.blocked.Store(b.Active)
	}
	if changed {
		p.changedLocked()
	}
	p.mu.Unlock()
	switch {
	case changed && b.Active:
		p.log.Warn("connection blocked by broker", "reason", b.Reason)
	case changed:
		p.log.Info("connection unblocked")
	}
}

// reconnect connects with backoff until it succeeds (nil) or ctx ends.
func (p *Publisher) reconnect(ctx context.Context) error {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = p.cfg.ReconnectMin
	b.MaxInterval = p.cfg.ReconnectMax
	b.MaxElapsedTime = 0
	attempts := 0
	start := time.Now()
	err := backoff.RetryNotify(func() error {
		attempts++
		err := p.connect(ctx)
		if errors.Is(err, ErrClosed) {
			return backoff.Permanent(err)
		}
		return err
	}, backoff.WithContext(b, ctx), func(err error, next time.Duration) {
		p.log.Warn("reconnect failed", "err", err, "attempt", attempts, "retry_in", next)
	})
	if err != nil {
		return err
	}
	p.log.Info("reconnected", "url", p.Broker(), "attempts", attempts, "after", time.Since(start).Round(time.Millisecond))
	return nil
}

// WaitReady blocks until the publisher is connected and the connection is
// not blocked by a broker resource alarm. It returns ctx's error if ctx ends
// first, ErrClosed once the publisher is closed.
func (p *Publisher) WaitReady(ctx context.Context) error {
	for {
		p.mu.Lock()
		ready, closed, changed := p.conn != nil && !p.isBlock, p.closed, p.changed
		p.mu.Unlock()
		switch {
		case closed:
			return ErrClosed
		case ready:
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("publish: wait ready: %w", ctx.Err())
		case <-changed:
		}
	}
}

// Close closes the connection and every channel, stops Run if it runs, and
// waits until everything the publisher started has stopped. Later calls to
// Publish fail with ErrClosed. It is safe to call more than once.
func (p *Publisher) Close() error {
	p.mu.Lock()
	p.closed = true
	stopRun, running := p.stopRun, p.running
	p.changedLocked()
	p.mu.Unlock()
	if running {
		stopRun()
		<-p.runDone
		return nil
	}
	p.teardown()
	return nil
}

// teardown closes the connection (bounded by closeTimeout), which ends
// every channel and every round trip in flight, then waits for every
// goroutine the publisher started.
func (p *Publisher) teardown() {
	p.teardownOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		conn := p.conn
		p.conn, p.idle = nil, nil
		p.changedLocked()
		p.mu.Unlock()
		if conn != nil {
			if err := conn.CloseDeadline(time.Now().Add(closeTimeout)); err != nil && !errors.Is(err, amqp.ErrClosed) {
				p.log.Warn("close connection", "err", err)
			}
		}
		p.wg.Wait()
		p.log.Info("closed")
	})
}

// start runs f in a goroutine the publisher waits for on Close, unless the
// publisher is closed.
func (p *Publisher) start(f func()) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		f()
	}()
	return true
}
