package notify

import (
	"context"
	"net"
	"net/url"
	"syscall"
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/stretchr/testify/require"
)

// TestListenerDialKeepAlive dials PostgreSQL with the listener's DialFunc
// and reads the socket options back from the kernel.
func TestListenerDialKeepAlive(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testkit.PostgresURL())
	require.NoError(t, err)
	cc := listenerConnConfig(parseConfig(t, testkit.PostgresURL()))

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := cc.DialFunc(ctx, "tcp", u.Host)
	require.NoError(t, err)
	defer conn.Close()

	raw, err := conn.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	got := map[string]int{}
	require.NoError(t, raw.Control(func(fd uintptr) {
		for name, opt := range map[string][2]int{
			"SO_KEEPALIVE":  {syscall.SOL_SOCKET, syscall.SO_KEEPALIVE},
			"TCP_KEEPIDLE":  {syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE},
			"TCP_KEEPINTVL": {syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL},
			"TCP_KEEPCNT":   {syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT},
		} {
			v, err := syscall.GetsockoptInt(int(fd), opt[0], opt[1])
			require.NoError(t, err, name)
			got[name] = v
		}
	}))
	require.Equal(t, map[string]int{"SO_KEEPALIVE": 1, "TCP_KEEPIDLE": 15, "TCP_KEEPINTVL": 5, "TCP_KEEPCNT": 3}, got)
}
