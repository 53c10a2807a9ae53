package main_test

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/notify"
)

// Passwords in DATABASE_URL and AMQP_URL never reach the logs, at debug
// level, through start-up, relaying and reconnects to both services.
func TestPasswordsNeverReachTheLogs(t *testing.T) {
	t.Parallel()
	const pgPassword = "pg-Pa55-never-logged"
	dbURL, pool := testkit.NewOutbox(t)
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = url.UserPassword("postgres", pgPassword) // trust auth: accepted, unused
	// The broker's only account is guest/guest: the password is the user
	// name, so what must not appear is the pair, in any of its forms.
	proxy, proxied := testkit.NewAMQPProxy(t)
	a, err := url.Parse(proxied)
	require.NoError(t, err)
	a.User = url.UserPassword("guest", "guest")

	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "#")
	p := startRelay(t, relayEnv(u.String(), exchange, "AMQP_URL="+a.String(), "OUTBOX_LOG_LEVEL=debug"),
		"--poll-interval=200ms")
	testkit.InsertEvents(t, pool, 10)
	queue.Receive(t, 10, 30*time.Second)

	// Reconnect to RabbitMQ: its URL is logged again.
	proxy.Cut()
	testkit.WaitFor(t, 30*time.Second, "the relay to notice the broker is gone", func() bool {
		return strings.Contains(p.Out.String(), "connection lost") || strings.Contains(p.Out.String(), "reconnect")
	})
	proxy.Restore()
	testkit.WaitFor(t, 60*time.Second, "the relay to reconnect to RabbitMQ", func() bool {
		return strings.Contains(p.Out.String(), `"msg":"reconnected"`)
	})
	// Reconnect to PostgreSQL: the listener's backend is terminated, once
	// it has connected (a backend terminated during the first connect
	// makes that connect fail, not a reconnect).
	testkit.WaitFor(t, 60*time.Second, "the listener to connect", func() bool {
		return strings.Contains(p.Out.String(), `"msg":"listener connected"`)
	})
	testkit.Exec(t, pool, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name = $1 AND datname = current_database()`, notify.ApplicationName)
	testkit.WaitFor(t, 60*time.Second, "the listener to reconnect", func() bool {
		return strings.Contains(p.Out.String(), "listener reconnected")
	})
	testkit.InsertEvents(t, pool, 10)
	queue.Receive(t, 10, 60*time.Second)
	p.Stop(60 * time.Second)

	logs := p.Out.String()
	require.Contains(t, logs, "xxxxx", "the URLs are logged, redacted")
	for _, secret := range []string{pgPassword, url.QueryEscape(pgPassword), "guest:guest", `"password":"guest"`, "password=guest"} {
		require.NotContains(t, logs, secret)
	}
}
