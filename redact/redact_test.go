package redact_test

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/redact"
)

func TestURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, raw, want string
	}{
		{"password", "amqp://guest:secret@rabbit:5672/", "amqp://guest:xxxxx@rabbit:5672/"},
		{"escaped password", "postgres://app:p%40ss%2Fw@db:5432/app?sslmode=disable", "postgres://app:xxxxx@db:5432/app?sslmode=disable"},
		{"password with a comma", "amqp://guest:a,b@rabbit/", "amqp://guest:xxxxx@rabbit/"},
		{"no password", "amqp://guest@rabbit:5672/", "amqp://guest@rabbit:5672/"},
		{"no user", "postgres://db:5432/app", "postgres://db:5432/app"},
		{"multi-host PostgreSQL", "postgres://app:secret@h1:5432,h2:5432/app", "postgres://app:xxxxx@h1:5432,h2:5432/app"},
		{"unparsable", "amqp://guest:se#cret@rabbit/", redact.Unparsable},
		{"keyword/value DSN", "host=db user=app password=secret", redact.Unparsable},
		{"empty", "", redact.Unparsable},
		{
			"list", "amqp://guest:secret-a@a:5672/,amqps://guest:secret-b@b:5671/",
			"amqp://guest:xxxxx@a:5672/,amqps://guest:xxxxx@b:5671/",
		},
		{
			"list with blanks", "amqp://guest:secret-a@a:5672/ , amqp://guest:secret-b@b:5672/",
			"amqp://guest:xxxxx@a:5672/,amqp://guest:xxxxx@b:5672/",
		},
		{
			"list with an unparsable element", "amqp://guest:secret-a@a/,amqp://guest:se#cret@b/,amqp://c/",
			"amqp://guest:xxxxx@a/," + redact.Unparsable + ",amqp://c/",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, redact.URL(tc.raw))
		})
	}
}

// The example of issue 14: with several URLs in AMQP_URL, the second
// password must not be shown in clear, neither by URL nor by Error.
func TestListHidesEveryPassword(t *testing.T) {
	t.Parallel()
	const (
		raw  = "amqp://guest:guest@127.0.0.1:1/,amqp://guest:guest@127.0.0.1:5672/"
		leak = "connect amqp://guest:xxxxx@127.0.0.1:1/,amqp://guest:guest@127.0.0.1:5672/"
	)
	shown := "connect " + redact.URL(raw)
	require.Equal(t, "connect amqp://guest:xxxxx@127.0.0.1:1/,amqp://guest:xxxxx@127.0.0.1:5672/", shown)
	require.NotEqual(t, leak, shown)

	err := redact.Error(fmt.Errorf("publish: connect %s: connection refused", raw), raw)
	require.NotContains(t, err.Error(), "guest:guest")
	require.NotContains(t, err.Error(), "127.0.0.1:1/,amqp://guest:guest@")

	// Two different passwords, each quoted alone.
	const two = "amqp://u:first-pw@a/,amqp://u:second-pw@b/"
	err = redact.Error(errors.New("a refused first-pw; b refused second-pw"), two)
	require.Equal(t, "a refused xxxxx; b refused xxxxx", err.Error())
}

func TestError(t *testing.T) {
	t.Parallel()
	// The password p@ss w/rd+ in the forms a library may quote it in.
	const pw = "p@ss w/rd+"
	const raw = "postgres://app:p%40ss%20w%2Frd+@db:5432/app"
	u, err := url.Parse(raw)
	require.NoError(t, err)
	got, _ := u.User.Password()
	require.Equal(t, pw, got)

	for _, form := range []string{
		pw,                    // decoded
		"p%40ss%20w%2Frd+",    // as written in raw
		url.QueryEscape(pw),   // p%40ss+w%2Frd%2B
		url.PathEscape(pw),    // p@ss%20w%2Frd+
		u.User.String()[4:],   // as url re-escapes user information
		"'" + pw + "' denied", // inside other text
	} {
		t.Run(form, func(t *testing.T) {
			t.Parallel()
			err := redact.Error(fmt.Errorf("connect: password %s rejected", form), raw)
			require.NotContains(t, err.Error(), form)
			require.Contains(t, err.Error(), "xxxxx")
			require.Contains(t, err.Error(), "connect: password ")
		})
	}
}

func TestErrorOnAnUnparsableURL(t *testing.T) {
	t.Parallel()
	// '#' must be escaped in a password; a library may still quote it.
	raw := "amqp://guest:se#cret@rabbit/"
	err := redact.Error(errors.New(`dial "amqp://guest:se#cret@rabbit/": bad URL`), raw)
	require.Equal(t, `dial "amqp://guest:xxxxx@rabbit/": bad URL`, err.Error())
}

func TestErrorLeavesOtherErrorsAlone(t *testing.T) {
	t.Parallel()
	require.NoError(t, redact.Error(nil, "amqp://guest:secret@rabbit/"))
	for _, raw := range []string{"amqp://guest:secret@rabbit/", "amqp://guest@rabbit/", "host=db password=secret", ""} {
		orig := errors.New("connection refused")
		require.Same(t, orig, redact.Error(orig, raw), "nothing to mask in %q", raw)
	}
}

type dialError struct{ addr string }

func (e *dialError) Error() string { return "dial " + e.addr }

func TestErrorKeepsTheChain(t *testing.T) {
	t.Parallel()
	raw := "postgres://app:secret@db:5432/app"
	orig := fmt.Errorf("connect to %s: %w: %w", raw, fs.ErrNotExist, &dialError{addr: "db:5432"})
	err := redact.Error(orig, raw)
	require.Equal(t, "connect to postgres://app:xxxxx@db:5432/app: file does not exist: dial db:5432", err.Error())
	require.ErrorIs(t, err, fs.ErrNotExist)
	var de *dialError
	require.ErrorAs(t, err, &de)
	require.Equal(t, "db:5432", de.addr)
	require.ErrorIs(t, fmt.Errorf("wrapped: %w", err), fs.ErrNotExist)
}
