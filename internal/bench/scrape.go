package bench

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The relay's metrics the benchmark reads. claimsMetric is the histogram
// of claim durations: its count is one per claim, whether the claim found
// events or not. gateClosesMetric counts the gate's closes. mallocsMetric
// is the Go runtime's count of heap allocations.
const (
	claimsMetric     = "outboxrelay_claim_duration_seconds"
	gateClosesMetric = "outboxrelay_gate_closes_total"
	mallocsMetric    = "go_memstats_mallocs_total"
)

// scrapeTimeout bounds one read of a relay's metrics.
const scrapeTimeout = 5 * time.Second

// counters are what the benchmark reads of a relay's metrics, each since
// the relay started.
type counters struct {
	claims       float64  // claims made, those that found nothing included
	claimSeconds float64  // the time they took, in all
	claimBuckets []bucket // their histogram, by ascending bound
	gateCloses   float64  // times the relay closed its notification gate
	mallocs      float64  // heap allocations, the metrics' own included
}

// bucket is one finite bucket of a histogram: how many observations were
// at most le.
type bucket struct{ le, count float64 }

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
	claims, closes, mallocs := families[claimsMetric], families[gateClosesMetric], families[mallocsMetric]
	if claims == nil || closes == nil || mallocs == nil {
		return counters{}, fmt.Errorf("relay metrics: no %s, %s or %s", claimsMetric, gateClosesMetric, mallocsMetric)
	}
	var c counters
	for _, m := range mallocs.GetMetric() {
		c.mallocs += m.GetCounter().GetValue()
	}
	byBound := map[float64]float64{}
	for _, m := range claims.GetMetric() {
		h := m.GetHistogram()
		c.claims += float64(h.GetSampleCount())
		c.claimSeconds += h.GetSampleSum()
		for _, b := range h.GetBucket() {
			if le := b.GetUpperBound(); !math.IsInf(le, +1) {
				byBound[le] += float64(b.GetCumulativeCount())
			}
		}
	}
	for le, n := range byBound {
		c.claimBuckets = append(c.claimBuckets, bucket{le, n})
	}
	slices.SortFunc(c.claimBuckets, func(a, b bucket) int { return cmp.Compare(a.le, b.le) })
	for _, m := range closes.GetMetric() {
		c.gateCloses += m.GetCounter().GetValue()
	}
	return c, nil
}

// claimTime is the claims' time between two readings of one relay's
// counters: their mean, and the bound of the histogram bucket that holds
// their 99th percentile (nearest rank), nil where it is above the largest
// finite bound. Nil if no claim was made between them.
func claimTime(begin, end counters) *ClaimTime {
	n := end.claims - begin.claims
	if n <= 0 {
		return nil
	}
	ct := &ClaimTime{Mean: (end.claimSeconds - begin.claimSeconds) / n * 1000}
	rank := math.Ceil(0.99 * n)
	for _, b := range end.claimBuckets {
		if b.count-begin.below(b.le) >= rank {
			ct.P99Bound = ptr(b.le * 1000)
			break
		}
	}
	return ct
}

// below is how many claims took at most le, from the bucket of that bound
// (0 if there is none: the reading was taken before the first claim).
func (c counters) below(le float64) float64 {
	for _, b := range c.claimBuckets {
		if b.le == le {
			return b.count
		}
	}
	return 0
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

// relayHTTPAddr is the --http-addr that args give the relay, the last one
// where there are several, and whether they give one at all. An empty
// address turns the relay's metrics off; another is where the benchmark
// reads them (a run that profiles the relay through --pprof sets it).
func relayHTTPAddr(args []string) (addr string, set bool) {
	return relayArg(args, "--http-addr")
}

// relayArg is the last value args give the relay's flag name ("--name
// value" or "--name=value"), and whether they give it at all.
func relayArg(args []string, name string) (value string, set bool) {
	for i, a := range args {
		switch {
		case a == name && i+1 < len(args):
			value, set = args[i+1], true
		case strings.HasPrefix(a, name+"="):
			value, set = strings.TrimPrefix(a, name+"="), true
		}
	}
	return value, set
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
