package testkit

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"
)

// Proxy is a TCP proxy between a client under test and a real service, able
// to cut, black-hole or slow the connections that pass through it. It runs in
// the test process (toxiproxy as a library) and stops when the test ends.
type Proxy struct {
	t     testing.TB
	proxy *toxiproxy.Proxy
}

// NewProxy starts a proxy on a free loopback port that forwards to upstream
// (host:port).
func NewProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(server, UniqueName("proxy"), "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("testkit: start proxy to %s: %v", upstream, err)
	}
	t.Cleanup(p.Stop)
	return &Proxy{t: t, proxy: p}
}

// Addr is the proxy's listening address, host:port.
func (p *Proxy) Addr() string { return p.proxy.Listen }

// Cut closes every connection through the proxy and refuses new ones until
// Restore.
func (p *Proxy) Cut() { p.proxy.Stop() }

// Restore accepts connections again on the same address after Cut.
func (p *Proxy) Restore() {
	p.t.Helper()
	if err := p.proxy.Start(); err != nil {
		p.t.Fatalf("testkit: restart proxy: %v", err)
	}
}

// Blackhole stops forwarding data in both directions without closing
// anything: a silent partition that only timeouts notice. Heal undoes it.
// After LoseReplies it silences the client's side too.
func (p *Proxy) Blackhole() {
	p.addToxic("blackhole_up", "upstream", "timeout", `{"timeout":0}`)
	if p.proxy.Toxics.GetToxic("blackhole_down") == nil {
		p.addToxic("blackhole_down", "downstream", "timeout", `{"timeout":0}`)
	}
}

// LoseReplies stops forwarding what the server sends, without closing
// anything, while what the client sends still reaches the server: requests
// are carried out and their replies lost, as those of requests in flight
// when a partition strikes are. Blackhole then silences the client's side
// too; Heal undoes both.
func (p *Proxy) LoseReplies() {
	p.addToxic("blackhole_down", "downstream", "timeout", `{"timeout":0}`)
}

// Hold stops passing on what the client sends, without dropping it or
// closing anything, while still passing what the server sends: a server
// that has stopped reading its socket, as RabbitMQ does with a connection
// it blocks. Heal passes on everything held, in order.
func (p *Proxy) Hold() {
	p.addToxic("hold_up", "upstream", "latency", `{"latency":3600000}`)
}

// Latency delays data in both directions by d.
func (p *Proxy) Latency(d time.Duration) {
	attrs := fmt.Sprintf(`{"latency":%d}`, d.Milliseconds())
	p.addToxic("latency_up", "upstream", "latency", attrs)
	p.addToxic("latency_down", "downstream", "latency", attrs)
}

// Bandwidth passes what the client sends at kbps kilobytes a second, in
// slices every 100 ms: a slow link, over which a large batch reaches the
// server, and is answered, bit by bit.
func (p *Proxy) Bandwidth(kbps int) {
	p.addToxic("bandwidth_up", "upstream", "bandwidth", fmt.Sprintf(`{"rate":%d}`, kbps))
}

// Heal removes every toxic (black hole, hold, latency, bandwidth).
func (p *Proxy) Heal() {
	p.proxy.Toxics.ResetToxics(context.Background())
}

func (p *Proxy) addToxic(name, stream, typ, attrs string) {
	p.t.Helper()
	body := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":%s}`, name, typ, stream, attrs)
	if _, err := p.proxy.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
		p.t.Fatalf("testkit: add toxic %s: %v", name, err)
	}
}

// LeakOptions are the goleak options of a package whose tests use a Proxy.
// toxiproxy v2.5.0 (the newest the module proxy serves) can leave a toxic's
// goroutine blocked for good on its output channel when a connection is cut
// while data is in flight: the link's writer has stopped reading. That
// goroutine belongs to the test's proxy, not to the code under test, so it
// is ignored; any other goroutine still fails the package.
func LeakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/toxics.(*NoopToxic).Pipe"),
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/toxics.(*LatencyToxic).Pipe"),
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/toxics.(*TimeoutToxic).Pipe"),
		// The same, one step before: a link reader whose toxic stopped
		// taking data (Hold, then the client closed the connection).
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/stream.(*ChanWriter).Write"),
	}
}
