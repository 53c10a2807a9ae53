package relay

import (
	"context"
	"errors"
	"io"
	"net"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxrelay/outboxrelay/publish"
)

// Observer is told what the relay does, for metrics (*metrics.Metrics has
// it). Its methods are called from the relay's workers on the hot path:
// they must be cheap, never block, and be safe for concurrent use.
type Observer interface {
	// Claimed reports one claim statement that took events (0 for an
	// empty claim) in took.
	Claimed(events int, took time.Duration)
	// Published reports events confirmed by the broker and marked
	// published, each with its lag from its created_at to its confirm,
	// and the batch's publish time, from its first publish to its last
	// confirm.
	Published(lags []time.Duration, took time.Duration)
	// Retried reports n events put back for another attempt after a
	// failure of the given reason (see Reason).
	Retried(reason string, n int)
	// DeadLettered reports n events dead-lettered after a failure of the
	// given reason.
	DeadLettered(reason string, n int)
	// Released reports n events given back unpublished, without counting
	// an attempt.
	Released(n int)
	// GateClosed reports whether the relay has closed the notification
	// gate (see Config.Gate).
	GateClosed(closed bool)
}

// Failure reasons, as Reason returns them.
const (
	ReasonReturned        = "returned"         // unroutable: the broker returned it
	ReasonNacked          = "nacked"           // the broker nacked it
	ReasonTimeout         = "timeout"          // no confirm within the confirm timeout
	ReasonMissingExchange = "missing_exchange" // its exchange does not exist
	ReasonConnection      = "connection"       // the connection or channel was lost
	ReasonInvalid         = "invalid"          // it can never be published as it is: malformed row, too large
	ReasonOther           = "other"
)

// Reason classifies a publish failure for metrics.
func Reason(err error) string {
	switch {
	case errors.Is(err, publish.ErrInvalid):
		return ReasonInvalid
	case errors.Is(err, publish.ErrReturned):
		return ReasonReturned
	case errors.Is(err, publish.ErrNacked):
		return ReasonNacked
	case errors.Is(err, publish.ErrExchangeNotFound):
		return ReasonMissingExchange
	case errors.Is(err, context.DeadlineExceeded):
		return ReasonTimeout
	case errors.Is(err, publish.ErrNotConnected), errors.Is(err, publish.ErrClosed), isConnectionError(err):
		return ReasonConnection
	}
	return ReasonOther
}

// isConnectionError reports an error of the broker connection or channel
// rather than of the message.
func isConnectionError(err error) bool {
	var (
		aerr *amqp.Error
		nerr net.Error
	)
	return errors.Is(err, amqp.ErrClosed) || errors.As(err, &aerr) || errors.As(err, &nerr) ||
		errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed)
}

// noObserver is the default Observer: it does nothing.
type noObserver struct{}

func (noObserver) Claimed(int, time.Duration)               {}
func (noObserver) Published([]time.Duration, time.Duration) {}
func (noObserver) Retried(string, int)                      {}
func (noObserver) DeadLettered(string, int)                 {}
func (noObserver) Released(int)                             {}
func (noObserver) GateClosed(bool)                          {}
