package bench

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// claimsMetric is the relay's histogram of claim durations: its count is
// one per claim, whether the claim found events or not.
const claimsMetric = "outboxrelay_claim_duration_seconds"

// scrapeTimeout bounds one read of a relay's metrics.
const scrapeTimeout = 5 * time.Second

// claims reads how many claims the relay whose metrics endpoint listens on
// addr has made since it started.
func claims(ctx context.Context, addr string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, fmt.Errorf("claims: %w", err)
	}
	req.Close = true // a few reads per run: no idle connection left behind
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("claims: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("claims: GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("claims: %w", err)
	}
	f, ok := families[claimsMetric]
	if !ok {
		return 0, fmt.Errorf("claims: no %s in the relay's metrics", claimsMetric)
	}
	var n float64
	for _, m := range f.GetMetric() {
		n += float64(m.GetHistogram().GetSampleCount())
	}
	return n, nil
}

// claimsOnceUp is claims for a relay that may not serve its metrics yet:
// one that has just started (a second relay of the scale workload, say,
// when the first drained everything meanwhile). It tries until the
// endpoint answers, for scrapeTimeout at most.
func claimsOnceUp(ctx context.Context, addr string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
	defer cancel()
	for {
		n, err := claims(ctx, addr)
		if err == nil {
			return n, nil
		}
		select {
		case <-ctx.Done():
			return 0, err
		case <-time.After(scrapeRetry):
		}
	}
}

// scrapeRetry spaces the attempts of claimsOnceUp.
const scrapeRetry = 50 * time.Millisecond

// metricsOff reports whether args set the relay's --http-addr, which leaves
// the benchmark no address of its own to read the relay's metrics from.
func metricsOff(args []string) bool {
	for _, a := range args {
		if a == "--http-addr" || strings.HasPrefix(a, "--http-addr=") {
			return true
		}
	}
	return false
}

// freeAddr is a loopback address whose port was free a moment ago, for a
// child's metrics endpoint.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("a port for the relay's metrics: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
