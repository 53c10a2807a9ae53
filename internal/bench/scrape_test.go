package bench

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/metrics"
)

// The claims and the gate's closes come from the relay's own metrics; a
// relay that does not serve them yet, just started, is read once it does.
func TestCountersAreReadFromTheRelaysMetricsOnceServed(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, metrics.Options{Version: "test"})
	require.NoError(t, err)
	for range 3 {
		m.Claimed(1, time.Millisecond)
	}
	m.Claimed(0, time.Millisecond) // one that found nothing counts too
	m.GateClosed(true)
	m.GateClosed(false)
	m.GateClosed(true)

	var requests atomic.Int32
	metricsHandler := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if requests.Add(1) == 1 {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		metricsHandler.ServeHTTP(w, r)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	_, err = scrape(context.Background(), ln.Addr().String())
	require.Error(t, err, "a relay not serving its metrics yet")
	c, err := scrapeOnceUp(context.Background(), ln.Addr().String())
	require.NoError(t, err)
	require.Equal(t, 4.0, c.claims)
	require.Equal(t, 2.0, c.gateCloses)
	require.Positive(t, c.mallocs, "the Go runtime's allocations, from the relay's own registry")
	require.InDelta(t, 0.004, c.claimSeconds, 1e-9)
	require.Equal(t, &ClaimTime{Mean: 1, P99Bound: ptr(1.0)}, claimTime(counters{}, c), "four claims of 1 ms, in the bucket of 1 ms")
}

// --relay-arg may set the relay's --http-addr: empty turns its metrics off,
// an address is where they are read (a run that profiles the relay).
func TestRelayArgsSetWhereTheMetricsAreRead(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		addr string
		set  bool
	}{
		{[]string{"--batch-size=1000"}, "", false},
		{[]string{"--http-addr="}, "", true},
		{[]string{"--http-addr=127.0.0.1:9470", "--pprof"}, "127.0.0.1:9470", true},
		{[]string{"--http-addr", "127.0.0.1:9999"}, "127.0.0.1:9999", true},
		{[]string{"--http-addr=127.0.0.1:1", "--http-addr="}, "", true},
	} {
		addr, set := relayHTTPAddr(tc.args)
		require.Equal(t, tc.addr, addr, "%q", tc.args)
		require.Equal(t, tc.set, set, "%q", tc.args)
	}
}
