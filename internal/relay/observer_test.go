package relay_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/relay"
	"github.com/outboxrelay/outboxrelay/publish"
)

func TestReasonClassifiesPublishFailures(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("event 1 headers: %w", publish.ErrInvalid), relay.ReasonInvalid},
		{fmt.Errorf("%w: 312 NO_ROUTE", publish.ErrReturned), relay.ReasonReturned},
		{publish.ErrNacked, relay.ReasonNacked},
		{fmt.Errorf("%w: %q", publish.ErrExchangeNotFound, "x"), relay.ReasonMissingExchange},
		{fmt.Errorf("publish: unconfirmed: %w", fmt.Errorf("confirm timeout 15s: %w", context.DeadlineExceeded)), relay.ReasonTimeout},
		{fmt.Errorf("%w: connection blocked", publish.ErrNotConnected), relay.ReasonConnection},
		{fmt.Errorf("publish: unconfirmed: channel closed: %w", amqp.ErrClosed), relay.ReasonConnection},
		{fmt.Errorf("publish: send: %w", io.EOF), relay.ReasonConnection},
		{errors.New("something else"), relay.ReasonOther},
	} {
		require.Equal(t, tc.want, relay.Reason(tc.err), "%v", tc.err)
	}
}
