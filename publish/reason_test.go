package publish_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/publish"
)

func TestReasonClassifiesPublishFailures(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("event 1 headers: %w", publish.ErrInvalid), publish.ReasonInvalid},
		{fmt.Errorf("%w: 312 NO_ROUTE", publish.ErrReturned), publish.ReasonReturned},
		{publish.ErrNacked, publish.ReasonNacked},
		{fmt.Errorf("%w: %q", publish.ErrExchangeNotFound, "x"), publish.ReasonMissingExchange},
		{fmt.Errorf("publish: unconfirmed: %w", fmt.Errorf("confirm timeout 15s: %w", context.DeadlineExceeded)), publish.ReasonTimeout},
		{fmt.Errorf("%w: connection blocked", publish.ErrNotConnected), publish.ReasonConnection},
		{fmt.Errorf("publish: unconfirmed: channel closed: %w", amqp.ErrClosed), publish.ReasonConnection},
		{fmt.Errorf("publish: check exchange: %w", &amqp.Error{Code: amqp.ChannelError, Reason: "CHANNEL_ERROR"}), publish.ReasonConnection},
		{fmt.Errorf("publish: send: %w", io.EOF), publish.ReasonConnection},
		{errors.New("something else"), publish.ReasonOther},
	} {
		require.Equal(t, tc.want, publish.Reason(tc.err), "%v", tc.err)
	}
}

// Reasons lists each reason once; a metric that reports them all from the
// start lists the same.
func TestReasonsListsEveryReasonOnce(t *testing.T) {
	t.Parallel()
	all := []string{publish.ReasonInvalid, publish.ReasonReturned, publish.ReasonNacked, publish.ReasonMissingExchange,
		publish.ReasonTimeout, publish.ReasonConnection, publish.ReasonOther}
	require.ElementsMatch(t, all, publish.Reasons())
}
