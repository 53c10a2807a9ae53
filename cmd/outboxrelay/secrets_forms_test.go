package main_test

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// formSecret is the password every connection-string form below carries.
// It holds unreserved characters only, so each of its encodings contains it
// whole, and the output of the binary must not hold it anywhere.
const formSecret = "s3cretPW-q7Z"

// unreachable is a TCP address nothing listens on.
const unreachable = "127.0.0.1:1"

// pgForm is one way of giving PostgreSQL a password in a connection
// string, built for a server address (host:port) and a database.
// shown is how the printed, redacted, form of the string shows its
// password.
type pgForm struct {
	name  string
	url   func(user, addr, db string) string
	shown string
}

var pgForms = []pgForm{
	{"user:pass@", func(user, addr, db string) string {
		return fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable", user, formSecret, addr, db)
	}, ":xxxxx@"},
	{"?password=", func(user, addr, db string) string {
		return fmt.Sprintf("postgres://%s@%s/%s?password=%s&sslmode=disable", user, addr, db, formSecret)
	}, "?password=xxxxx&"},
	{"?sslpassword=", func(user, addr, db string) string { // accepted, unused with sslmode=disable
		return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable&sslpassword=%s", user, addr, db, formSecret)
	}, "&sslpassword=xxxxx"},
	{"keyword/value password=", func(user, addr, db string) string {
		host, port, _ := net.SplitHostPort(addr)
		return fmt.Sprintf("host=%s port=%s dbname=%s user=%s password=%s sslmode=disable", host, port, db, user, formSecret)
	}, " password=xxxxx sslmode=disable"},
	{"keyword/value password = 'quoted'", func(user, addr, db string) string {
		host, port, _ := net.SplitHostPort(addr)
		return fmt.Sprintf(`host=%s port=%s dbname=%s user=%s password = '%s it\'s' sslmode=disable`, host, port, db, user, formSecret)
	}, " password = xxxxx sslmode=disable"},
}

// Whatever form a connection string carries its password in, the binary
// prints it nowhere (issue 28): not in run's start-up line and errors, nor
// in migrate's, nor in the admin commands', against a server that answers
// and one that does not; and where it prints the URL, it prints it
// redacted, with its password masked and not replaced as a whole.
func TestSecretFormsNeverReachTheOutput(t *testing.T) {
	t.Parallel()
	dbURL, _ := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	user, reachable, db := u.User.Username(), u.Host, strings.TrimPrefix(u.Path, "/")
	amqpURL, err := url.Parse(testkit.AMQPURL())
	require.NoError(t, err)
	amqpURL.User = url.UserPassword("guest", "guest") // the broker's only account
	// Where PostgreSQL's URL carries the password, RabbitMQ's carries none
	// (guest/guest by default), so that only the former can show "xxxxx".
	noCredentials := *amqpURL
	noCredentials.User = nil
	plainAMQP := "AMQP_URL=" + noCredentials.String()

	type run struct {
		name    string
		env     []string
		args    []string
		up      bool     // the command succeeds; run keeps running until stopped
		fails   string   // unless up, what its error says
		shown   string   // what the output shows of the redacted URL; "" if it prints none
		secrets []string // what must appear nowhere
	}
	var runs []run
	for _, f := range pgForms {
		for _, target := range []struct {
			name, addr string
			up         bool
		}{{"unreachable", unreachable, false}, {"reachable", reachable, true}} {
			form := f.url(user, target.addr, db)
			name := f.name + "/" + target.name + "/"
			secrets := []string{formSecret}
			status := f.shown // status prints the URL only in its error
			if target.up {
				status = ""
			}
			runs = append(runs,
				run{name + "run", relayEnv(form, exchange, plainAMQP), nil, target.up, "unreachable", f.shown, secrets},
				run{name + "migrate", relayEnv(form, exchange), []string{"migrate"}, target.up, "unreachable", f.shown, secrets},
				run{name + "status", adminEnv(form), []string{"status"}, target.up, "unreachable", status, secrets},
				run{name + "run --listener-url", relayEnv(dbURL, exchange, plainAMQP, "OUTBOX_LISTENER_URL="+form), nil,
					target.up, "unreachable", f.shown, secrets},
			)
		}
	}
	closed := "amqp://guest:" + formSecret + "@" + unreachable + "/"
	runs = append(runs,
		run{"amqp user:pass@/unreachable/run", relayEnv(dbURL, exchange, "AMQP_URL="+closed), nil, false, "RabbitMQ", "guest:xxxxx@",
			[]string{formSecret}},
		// A list, at debug level: the first broker's failure is logged,
		// then the second (guest:guest, so the pair must not appear) answers.
		run{"amqp user:pass@/reachable/run", relayEnv(dbURL, exchange, "AMQP_URL="+closed+","+amqpURL.String(), "OUTBOX_LOG_LEVEL=debug"),
			nil, true, "", "guest:xxxxx@", []string{formSecret, "guest:guest", "password=guest", `"password":"guest"`}},
	)

	for _, r := range runs {
		t.Run(r.name, func(t *testing.T) {
			t.Parallel()
			var out string
			switch {
			case r.up && len(r.args) == 0: // run: await its start-up line, then stop it
				p := startRelay(t, r.env)
				testkit.WaitFor(t, 60*time.Second, "the relay to start or exit", func() bool {
					select {
					case <-p.Done():
						return true
					default:
						return strings.Contains(p.Out.String(), "outboxrelay starting")
					}
				})
				require.Contains(t, p.Out.String(), "outboxrelay starting")
				p.Stop(60 * time.Second)
				out = p.Out.String()
			default:
				code, stdout, stderr := runOnce(t, r.env, r.args...)
				out = stdout + stderr
				if r.up {
					require.Equal(t, 0, code, out)
				} else {
					require.Equal(t, 2, code, out)
					require.Contains(t, out, r.fails)
				}
			}
			for _, s := range r.secrets {
				require.NotContains(t, out, s)
			}
			require.NotContains(t, out, "(unparsable URL)", "the URL is shown, not replaced as a whole")
			if r.shown != "" {
				require.Contains(t, out, r.shown, "the URL is printed, redacted")
			}
		})
	}
}
