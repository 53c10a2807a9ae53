package notify

// The heartbeat: a Listener with a Pinger sends pg_notify on a private
// channel over another connection every PingInterval, and waits for it to
// come back on the listening connection; one that does not come back
// within PingTimeout means the listening connection is dead (a silent
// partition, say, which TCP keepalive may take minutes to find), and the
// session is abandoned and reconnected. A notification on Channel proves
// the connection as well, so an interval that brought one sends no
// heartbeat: the commit of a NOTIFY takes a lock all notifying commits
// queue on, and producers that notify should not queue behind the
// relay's.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// watchdog sends a heartbeat every PingInterval while connected and
// abandons the session when one does not come back. While the listener
// lacks the listen lock, it beats every listenLockRetry at most: the
// heartbeat's return is where the listener tries for the lock again.
func (s *session) watchdog(ctx context.Context) {
	t := time.NewTimer(s.interval())
	defer t.Stop()
	heard := s.l.notified.Load()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if n := s.l.notified.Load(); n != heard && s.l.holdsLock.Load() {
			heard = n // the connection delivered notifications: alive
		} else if gen, ok := s.current(); ok && !s.ping(ctx, gen) {
			s.abandon()
			return
		}
		t.Reset(s.interval())
	}
}

// interval is the time to the next heartbeat.
func (s *session) interval() time.Duration {
	if s.l.holdsLock.Load() {
		return s.l.cfg.PingInterval
	}
	return min(s.l.cfg.PingInterval, listenLockRetry)
}

// ping sends one heartbeat through the Pinger and waits for it on the
// listening connection. It returns false only when connection gen is
// still the current one and the heartbeat did not come back in time.
func (s *session) ping(ctx context.Context, gen uint64) bool {
	l := s.l
	seq := l.pingSeq.Add(1)

	sendCtx, cancel := context.WithTimeout(ctx, l.cfg.PingTimeout)
	_, err := l.cfg.Pinger.Exec(sendCtx, "SELECT pg_notify($1, $2)", l.pingChannel, strconv.FormatUint(seq, 10))
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			// Says nothing about the listening connection: try again later.
			l.log.Warn("listener heartbeat not sent", l.errAttr(fmt.Errorf("notify: ping: %w", err)))
		}
		return true
	}

	// The notification is committed now; give the listening connection
	// PingTimeout to deliver it, whatever the Pinger took.
	start := time.Now()
	deadline := time.NewTimer(l.cfg.PingTimeout)
	defer deadline.Stop()
	for l.pongSeq.Load() < seq {
		select {
		case <-l.pong:
		case <-ctx.Done():
			return true
		case <-deadline.C:
			if g, ok := s.current(); !ok || g != gen {
				return true // that connection is gone already
			}
			l.log.Warn("listener heartbeat timed out, reconnecting", "timeout", l.cfg.PingTimeout)
			return false
		}
	}
	l.log.Debug("listener heartbeat", "rtt", time.Since(start))
	return true
}

// handlePong records a heartbeat that came back on the listening
// connection, and tries for the listen lock if the listener lacks it: once
// taken, the producers that did not notify meanwhile have ended, and a
// wake-up finds their events.
func (l *Listener) handlePong(ctx context.Context, n *pgconn.Notification, conn *pgx.Conn) error {
	seq, err := strconv.ParseUint(n.Payload, 10, 64)
	if err != nil {
		return nil // not a heartbeat of ours; nothing to do
	}
	if seq > l.pongSeq.Load() { // only this goroutine stores
		l.pongSeq.Store(seq)
	}
	select {
	case l.pong <- struct{}{}:
	default:
	}
	if l.takeListenLock(ctx, conn) {
		l.signal()
	}
	return nil
}

// pingChannel returns a private channel name for the heartbeat: channel,
// shortened if need be, plus "_ping_" and 16 random hex digits, at most
// 63 bytes.
func pingChannel(channel string) string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails
	suffix := "_ping_" + hex.EncodeToString(b[:])
	for len(channel)+len(suffix) > maxChannelBytes {
		_, size := utf8.DecodeLastRuneInString(channel)
		channel = channel[:len(channel)-size]
	}
	return channel + suffix
}
