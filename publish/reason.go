package publish

import (
	"context"
	"errors"
	"io"
	"net"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The reasons a message's publish failed, as Reason names them. They are
// the one vocabulary of a failure's class: the reason label of the relay's
// metrics (which alert rules and dashboards select on), the reason
// attribute of its log lines, and the error.type attribute of the PRODUCER
// spans. They are stable: a new kind of failure gets a new reason, an
// existing reason keeps its word.
const (
	ReasonInvalid         = "invalid"          // it can never be published as it is (ErrInvalid)
	ReasonReturned        = "returned"         // unroutable: the broker returned it (ErrReturned)
	ReasonNacked          = "nacked"           // the broker nacked it (ErrNacked)
	ReasonMissingExchange = "missing_exchange" // its exchange does not exist (ErrExchangeNotFound)
	ReasonTimeout         = "timeout"          // no confirm within the confirm timeout
	ReasonConnection      = "connection"       // the connection or channel was lost, or is down
	ReasonOther           = "other"            // none of the above
)

// Reasons lists every reason Reason returns, in a fixed order, so that a
// metric can report each from the start.
func Reasons() []string {
	return []string{ReasonReturned, ReasonNacked, ReasonTimeout, ReasonMissingExchange,
		ReasonConnection, ReasonInvalid, ReasonOther}
}

// Reason classifies a publish failure (an error of Publish's results, or
// one a caller wrapped around it) as one of the Reason constants. It
// decides by the errors err wraps (errors.Is and errors.As), never by its
// text.
func Reason(err error) string {
	switch {
	case errors.Is(err, ErrInvalid):
		return ReasonInvalid
	case errors.Is(err, ErrReturned):
		return ReasonReturned
	case errors.Is(err, ErrNacked):
		return ReasonNacked
	case errors.Is(err, ErrExchangeNotFound):
		return ReasonMissingExchange
	case errors.Is(err, context.DeadlineExceeded):
		return ReasonTimeout
	case errors.Is(err, ErrNotConnected), errors.Is(err, ErrClosed), isConnectionError(err):
		return ReasonConnection
	}
	return ReasonOther
}

// isConnectionError reports an error of the broker connection or channel
// rather than of the message: an AMQP exception (which closes the channel
// or the connection), a closed connection, a network error.
func isConnectionError(err error) bool {
	var (
		aerr *amqp.Error
		nerr net.Error
	)
	return errors.Is(err, amqp.ErrClosed) || errors.As(err, &aerr) || errors.As(err, &nerr) ||
		errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed)
}
