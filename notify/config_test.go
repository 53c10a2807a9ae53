package notify

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func parseConfig(t *testing.T, url string) *pgx.ConnConfig {
	t.Helper()
	cc, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	return cc
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	cc := parseConfig(t, "postgres://postgres@127.0.0.1:5432/x")
	tests := []struct {
		name  string
		cfg   Config
		field string // "" when valid
	}{
		{"only ConnConfig", Config{ConnConfig: cc}, ""},
		{"missing ConnConfig", Config{}, "ConnConfig"},
		{"channel of 63 bytes", Config{ConnConfig: cc, Channel: strings.Repeat("c", 63)}, ""},
		{"channel of 64 bytes", Config{ConnConfig: cc, Channel: strings.Repeat("c", 64)}, "Channel"},
		{"negative ReconnectMin", Config{ConnConfig: cc, ReconnectMin: -time.Second}, "ReconnectMin"},
		{"ReconnectMax below ReconnectMin", Config{ConnConfig: cc, ReconnectMin: time.Second, ReconnectMax: time.Millisecond}, "ReconnectMax"},
		{"large ReconnectMin alone", Config{ConnConfig: cc, ReconnectMin: time.Minute}, ""},
		{"negative ReconnectMax", Config{ConnConfig: cc, ReconnectMax: -time.Second}, "ReconnectMax"},
		{"negative ConnectTimeout", Config{ConnConfig: cc, ConnectTimeout: -time.Second}, "ConnectTimeout"},
		{"negative PingInterval", Config{ConnConfig: cc, PingInterval: -time.Second}, "PingInterval"},
		{"negative PingTimeout", Config{ConnConfig: cc, PingTimeout: -time.Second}, "PingTimeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.cfg.Validate()
			_, newErr := New(tt.cfg)
			if tt.field == "" {
				require.NoError(t, err)
				require.NoError(t, newErr)
				return
			}
			require.ErrorContains(t, err, tt.field)
			require.ErrorContains(t, err, "notify: ")
			require.Equal(t, err, newErr)
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	cfg := Config{}.withDefaults()
	require.Equal(t, "outbox", cfg.Channel)
	require.Equal(t, 100*time.Millisecond, cfg.ReconnectMin)
	require.Equal(t, 5*time.Second, cfg.ReconnectMax)
	require.Equal(t, 10*time.Second, cfg.ConnectTimeout)
	require.Equal(t, 30*time.Second, cfg.PingInterval)
	require.Equal(t, 5*time.Second, cfg.PingTimeout)
	require.NotNil(t, cfg.Logger)

	l, err := New(Config{ConnConfig: parseConfig(t, "postgres://postgres@127.0.0.1:5432/x"), ReconnectMin: time.Second, ReconnectMax: 7 * time.Second})
	require.NoError(t, err)
	require.Equal(t, time.Second, l.backoff.InitialInterval)
	require.Equal(t, 7*time.Second, l.backoff.MaxInterval)
	require.Zero(t, l.backoff.MaxElapsedTime, "a daemon's backoff never gives up")
	require.Empty(t, l.pingChannel, "no heartbeat without a Pinger")
}

func TestListenerConnConfig(t *testing.T) {
	t.Parallel()

	t.Run("sets application_name, leaves the caller's config alone", func(t *testing.T) {
		t.Parallel()
		orig := parseConfig(t, "postgres://postgres@127.0.0.1:5432/x")
		cc := listenerConnConfig(orig)
		require.Equal(t, ApplicationName, cc.RuntimeParams["application_name"])
		require.NotContains(t, orig.RuntimeParams, "application_name")
	})

	t.Run("keeps an application_name already set", func(t *testing.T) {
		t.Parallel()
		cc := listenerConnConfig(parseConfig(t, "postgres://postgres@127.0.0.1:5432/x?application_name=mine"))
		require.Equal(t, "mine", cc.RuntimeParams["application_name"])
	})

	t.Run("keeps a custom DialFunc", func(t *testing.T) {
		t.Parallel()
		errCustom := errors.New("custom dialer")
		orig := parseConfig(t, "postgres://postgres@127.0.0.1:5432/x")
		orig.DialFunc = func(context.Context, string, string) (net.Conn, error) { return nil, errCustom }
		cc := listenerConnConfig(orig)
		_, err := cc.DialFunc(context.Background(), "tcp", "127.0.0.1:1")
		require.ErrorIs(t, err, errCustom)
	})

	// That pgx's default dialer is replaced by one with the listener's
	// keepalive is proved on a real socket in config_linux_test.go: Go's
	// own default keepalive (15 s interval, 9 probes) fails it.
}

func TestPingChannel(t *testing.T) {
	t.Parallel()
	for _, channel := range []string{"outbox", strings.Repeat("c", 63), strings.Repeat("é", 31) + "c"} {
		p := pingChannel(channel)
		require.LessOrEqual(t, len(p), maxChannelBytes, p)
		require.True(t, utf8.ValidString(p), p)
		require.Contains(t, p, "_ping_")
		require.NotEqual(t, p, pingChannel(channel), "random per listener")
	}
	require.True(t, strings.HasPrefix(pingChannel("outbox"), "outbox_ping_"))
}

func TestErrAttrMasksPassword(t *testing.T) {
	t.Parallel()
	l, err := New(Config{ConnConfig: parseConfig(t, "postgres://postgres:Sup3r-S3cret@127.0.0.1:5432/x")})
	require.NoError(t, err)
	attr := l.errAttr(errors.New("failed with password Sup3r-S3cret in it"))
	require.Equal(t, "err", attr.Key)
	require.NotContains(t, attr.Value.String(), "Sup3r-S3cret")
	require.Contains(t, attr.Value.String(), "failed with password")
}
