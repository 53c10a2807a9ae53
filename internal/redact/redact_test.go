package redact_test

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/redact"
)

// Every form a connection string can carry a password in: what URL shows
// of it, and the password as a library might quote it in an error, which
// Error masks (in each form given, and as written, decoded and escaped).
func TestForms(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, raw, url string
		secrets        []string // the password(s), as a library might quote them
	}{
		// The user information.
		{"password", "amqp://guest:secret@rabbit:5672/", "amqp://guest:xxxxx@rabbit:5672/", []string{"secret"}},
		{
			"escaped password", "postgres://app:p%40ss%2Fw@db:5432/app?sslmode=disable",
			"postgres://app:xxxxx@db:5432/app?sslmode=disable", []string{"p%40ss%2Fw", "p@ss/w", "p@ss%2Fw"},
		},
		{"password with a comma", "amqp://guest:a,b@rabbit/", "amqp://guest:xxxxx@rabbit/", []string{"a,b"}},
		{"no password", "amqp://guest@rabbit:5672/", "amqp://guest@rabbit:5672/", nil},
		{"no user", "postgres://db:5432/app", "postgres://db:5432/app", nil},
		{"multi-host PostgreSQL", "postgres://app:secret@h1:5432,h2:5432/app", "postgres://app:xxxxx@h1:5432,h2:5432/app", []string{"secret"}},
		{"unparsable", "amqp://guest:se#cret@rabbit/", redact.Unparsable, []string{"se#cret"}},
		{
			// net/url ends the authority at "?" (host u, port 12), pgx
			// takes "12?x" for the password: no reading is safe to show.
			"user information read two ways", "postgres://u:12?x@h/db", redact.Unparsable, []string{"12?x"},
		},

		// The password and sslpassword query parameters.
		{
			"password parameter", "postgres://app@db:5432/app?password=s3cretPW&sslmode=disable",
			"postgres://app@db:5432/app?password=xxxxx&sslmode=disable", []string{"s3cretPW"},
		},
		{
			"sslpassword parameter", "postgres://app@db/app?sslmode=verify-full&sslpassword=key-pa55",
			"postgres://app@db/app?sslmode=verify-full&sslpassword=xxxxx", []string{"key-pa55"},
		},
		{
			"escaped parameter", "postgres://db/app?password=p%40ss+w%2Frd",
			"postgres://db/app?password=xxxxx", []string{"p%40ss+w%2Frd", "p@ss+w/rd", "p@ss w/rd", "p%40ss%2Bw%2Frd"},
		},
		{
			"name in another case or escaped", "postgres://db/app?PassWord=first-pw&ssl%70assword=second-pw&application_name=me",
			"postgres://db/app?PassWord=xxxxx&ssl%70assword=xxxxx&application_name=me", []string{"first-pw", "second-pw"},
		},
		{
			"password in both places", "postgres://app:one-pw@db/app?password=two-pw",
			"postgres://app:xxxxx@db/app?password=xxxxx", []string{"one-pw", "two-pw"},
		},
		{
			// pgx reads "#" as part of the value, net/url as a fragment.
			"hash in a parameter", "postgres://db/app?password=se#cret&sslmode=disable",
			"postgres://db/app?password=xxxxx&sslmode=disable", []string{"se#cret", "se%23cret"},
		},
		{
			// pgx's database is "app#", its query password=hidden.
			"parameter after a hash", "postgres://db/app#?password=hidden-pw",
			"postgres://db/app#?password=xxxxx", []string{"hidden-pw"},
		},
		{"empty parameter", "postgres://db/app?password=&sslmode=disable", "postgres://db/app?password=&sslmode=disable", nil},
		{
			"multi-host with a parameter", "postgres://h1:5432,h2:5432/app?password=s3cret&target_session_attrs=read-write",
			"postgres://h1:5432,h2:5432/app?password=xxxxx&target_session_attrs=read-write", []string{"s3cret"},
		},

		// Keyword/value DSNs.
		{"keyword/value DSN", "host=db user=app password=secret", "host=db user=app password=xxxxx", []string{"secret"}},
		{
			"sslpassword keyword", "host=db sslmode=verify-full sslpassword=key-pw user=app",
			"host=db sslmode=verify-full sslpassword=xxxxx user=app", []string{"key-pw"},
		},
		{
			"quoted, blanks around =", `host=db password = 'a b\'c' dbname=app`,
			"host=db password = xxxxx dbname=app", []string{`'a b\'c'`, `a b\'c`, "a b'c", "a+b%27c", "a%20b%27c"},
		},
		{"escaped blank", `host=db password=pw\ x1 port=5432`, "host=db password=xxxxx port=5432", []string{`pw\ x1`, "pw x1"}},
		{
			"multi-host DSN", "host=h1,h2 port=5432,5433 password=pw-x target_session_attrs=read-write",
			"host=h1,h2 port=5432,5433 password=xxxxx target_session_attrs=read-write", []string{"pw-x"},
		},
		{"quoted URL-like value", "password='x,amqp://y' host=db", "password=xxxxx host=db", []string{"x,amqp://y"}},
		{"unterminated quote", "host=db password='abc-pw", redact.Unparsable, []string{"abc-pw"}},
		{"not a connection string", "db.example.com:5432", redact.Unparsable, nil},
		{"empty", "", redact.Unparsable, nil},

		// Lists.
		{
			"list", "amqp://guest:secret-a@a:5672/,amqps://guest:secret-b@b:5671/",
			"amqp://guest:xxxxx@a:5672/,amqps://guest:xxxxx@b:5671/", []string{"secret-a", "secret-b"},
		},
		{
			"list with blanks", "amqp://guest:secret-a@a:5672/ , amqp://guest:secret-b@b:5672/",
			"amqp://guest:xxxxx@a:5672/,amqp://guest:xxxxx@b:5672/", []string{"secret-a", "secret-b"},
		},
		{
			"list with an unparsable element", "amqp://guest:secret-a@a/,amqp://guest:se#cret@b/,amqp://c/",
			"amqp://guest:xxxxx@a/," + redact.Unparsable + ",amqp://c/", []string{"secret-a", "se#cret"},
		},
		{
			"list with parameters", "amqp://guest:a-pw@a/?heartbeat=10,amqp://guest:b-pw@b/?password=c-pw",
			"amqp://guest:xxxxx@a/?heartbeat=10,amqp://guest:xxxxx@b/?password=xxxxx", []string{"a-pw", "b-pw", "c-pw"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			shown := redact.URL(tc.raw)
			require.Equal(t, tc.url, shown)
			for _, s := range tc.secrets {
				require.NotContains(t, shown, s)
				err := redact.Error(fmt.Errorf("connect: password %s rejected", s), tc.raw)
				require.Equal(t, "connect: password xxxxx rejected", err.Error(), s)
			}
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
