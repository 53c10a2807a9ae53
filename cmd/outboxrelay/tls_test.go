package main_test

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// amqpsURL is the test broker's URL through a TLS proxy.
func amqpsURL(t *testing.T) (*testkit.TLSProxy, string) {
	t.Helper()
	u, err := url.Parse(testkit.AMQPURL())
	require.NoError(t, err)
	proxy := testkit.NewTLSProxy(t, u.Host)
	u.Scheme, u.Host = "amqps", proxy.Addr
	return proxy, u.String()
}

// The relay reaches RabbitMQ over amqps:// with the CA, client certificate
// and key it is given: a real handshake, the real broker behind it.
func TestRelayPublishesOverAMQPS(t *testing.T) {
	t.Parallel()
	proxy, amqps := amqpsURL(t)
	dbURL, pool := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "#")
	p := startRelay(t, relayEnv(dbURL, exchange, "AMQP_URL="+amqps,
		"AMQP_CA_FILE="+proxy.CAFile, "AMQP_CERT_FILE="+proxy.CertFile, "AMQP_KEY_FILE="+proxy.KeyFile))
	testkit.InsertEvents(t, pool, 20)
	queue.Receive(t, 20, 30*time.Second)
	p.Stop(60 * time.Second)
	require.Contains(t, p.Out.String(), "amqps://guest:xxxxx@")
}

// TLS that cannot work stops the relay at start-up with exit code 2 and a
// line naming what is wrong; nothing is claimed.
func TestBadTLSSettingsFailAtStartUp(t *testing.T) {
	t.Parallel()
	proxy, amqps := amqpsURL(t)
	dbURL, pool := testkit.NewOutbox(t)
	testkit.InsertEvents(t, pool, 5)
	for _, tc := range []struct {
		name string
		env  []string
		want string
	}{
		{"server signed by another CA", []string{"AMQP_CA_FILE=" + proxy.OtherCAFile, "AMQP_CERT_FILE=" + proxy.CertFile, "AMQP_KEY_FILE=" + proxy.KeyFile}, "certificate"},
		{"no client certificate", []string{"AMQP_CA_FILE=" + proxy.CAFile}, "RabbitMQ"},
		{"CA file missing", []string{"AMQP_CA_FILE=/nonexistent/ca.pem"}, "--amqp-ca"},
		{"certificate without key", []string{"AMQP_CA_FILE=" + proxy.CAFile, "AMQP_CERT_FILE=" + proxy.CertFile}, "--amqp-key"},
		{"CA file holds no certificate", []string{"AMQP_CA_FILE=" + proxy.KeyFile}, "no PEM certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := relayEnv(dbURL, "unused", append([]string{"AMQP_URL=" + amqps}, tc.env...)...)
			code, _, stderr := runOnce(t, env, "--no-migrate")
			require.Equal(t, 2, code, stderr)
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			last := lines[len(lines)-1]
			require.True(t, strings.HasPrefix(last, "outboxrelay: "), last)
			require.Contains(t, last, tc.want)
		})
	}
	code, _, stderr := runOnce(t, relayEnv(dbURL, "unused", "AMQP_CA_FILE="+proxy.CAFile), "--no-migrate")
	require.Equal(t, 2, code, stderr)
	require.Contains(t, stderr, "need an amqps:// URL")
	require.EqualValues(t, 5, testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE attempts = 0 AND lease_id IS NULL`))
}

// The relay reaches PostgreSQL with sslmode=verify-full when DATABASE_URL
// says so: every one of its sessions, the pool's and the listener's, is
// encrypted, and a certificate it cannot verify (an unknown CA, or a host
// name the certificate is not for) stops it at start-up, exit code 2.
func TestRelayConnectsToPostgresWithVerifyFull(t *testing.T) {
	t.Parallel()
	rootCert, host := testkit.PostgresTLS(t)
	dbURL, pool := testkit.NewOutbox(t)
	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "#")

	p := startRelay(t, relayEnv(testkit.WithTLS(t, dbURL, rootCert, host), exchange), "--no-migrate")
	testkit.InsertEvents(t, pool, 20)
	queue.Receive(t, 20, 30*time.Second)
	sessions := func(ssl bool) int64 {
		return testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
			WHERE a.datname = current_database() AND a.application_name LIKE 'outboxrelay%' AND s.ssl = $1`, ssl)
	}
	testkit.WaitFor(t, 10*time.Second, "the listener's session", func() bool {
		return testkit.QueryInt(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND application_name = 'outboxrelay-listener'`) == 1
	})
	require.Zero(t, sessions(false), "a relay session without TLS")
	require.GreaterOrEqual(t, sessions(true), int64(2), "the pool's and the listener's sessions")
	p.Stop(60 * time.Second)

	for _, tc := range []struct {
		name, url string
	}{
		{"unknown CA", testkit.WithTLS(t, dbURL, testkit.NewCAFile(t), host)},
		{"host name not in the certificate", testkit.WithTLS(t, dbURL, rootCert, "127.0.0.1")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runOnce(t, relayEnv(tc.url, exchange), "--no-migrate")
			require.Equal(t, 2, code, stderr)
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			last := lines[len(lines)-1]
			require.Contains(t, last, "PostgreSQL")
			require.Contains(t, last, "certificate")
		})
	}
}
