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

// The relay's metrics the benchmark reads. claimsMetric is the histogram
// of claim durations: its count is one per claim, whether the claim found
// events or not. gateClosesMetric counts the gate's closes.
const (
	claimsMetric     = "outboxrelay_claim_duration_seconds"
	gateClosesMetric = "outboxrelay_gate_closes_total"
)

// scrapeTimeout bounds one read of a relay's metrics.
const scrapeTimeout = 5 * time.Second

// counters are what the benchmark reads of a relay's metrics, each since
// the relay started.
type counters struct {
	claims     float64 // claims made, those that found nothing included
	gateCloses float64 // times the relay closed its notification gate
}

// scrape reads the counters of the relay whose metrics endpoint listens
// on addr.
func scrape(ctx context.Context, addr string) (counters, error) {
	ctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return counters{}, fmt.Errorf("relay metrics: %w", err)
	}
	req.Close = true // a few reads per run: no idle connection left behind
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return counters{}, fmt.Errorf("relay metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return counters{}, fmt.Errorf("relay metrics: GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return counters{}, fmt.Errorf("relay metrics: %w", err)
	}
	claims, closes := families[claimsMetric], families[gateClosesMetric]
	if claims == nil || closes == nil {
		return counters{}, fmt.Errorf("relay metrics: no %s or no %s", claimsMetric, gateClosesMetric)
	}
	var c counters
	for _, m := range claims.GetMetric() {
		c.claims += float64(m.GetHistogram().GetSampleCount())
	}
	for _, m := range closes.GetMetric() {
		c.gateCloses += m.GetCounter().GetValue()
	}
	return c, nil
}

// scrapeOnceUp is scrape for a relay that may not serve its metrics yet:
// one that has just started (a second relay of the scale workload, say,
// when the first drained everything meanwhile). It tries until the
// endpoint answers, for scrapeTimeout at most.
func scrapeOnceUp(ctx context.Context, addr string) (counters, error) {
	ctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
	defer cancel()
	for {
		c, err := scrape(ctx, addr)
		if err == nil {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return counters{}, err
		case <-time.After(scrapeRetry):
		}
	}
}

// scrapeRetry spaces the attempts of scrapeOnceUp.
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
