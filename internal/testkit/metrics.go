package testkit

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// HTTPAddr waits for a relay's log line saying where its operations
// endpoints listen (with OUTBOX_HTTP_ADDR=127.0.0.1:0 the port is its own)
// and returns the address.
func HTTPAddr(t testing.TB, out *Buffer) string {
	t.Helper()
	var addr string
	WaitFor(t, 30*time.Second, "the relay's operations endpoints", func() bool {
		for _, line := range strings.Split(out.String(), "\n") {
			var rec struct {
				Msg  string `json:"msg"`
				Addr string `json:"addr"`
			}
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "operations endpoints listening" {
				addr = rec.Addr
				return true
			}
		}
		return false
	})
	return addr
}

// Metrics is one scrape: each sample's value by its name and labels, as
// Prometheus writes them (name{a="x",b="y"}, labels sorted).
type Metrics map[string]float64

// Get returns the value of the sample name{labels…} (label pairs as
// "key", "value", …) and whether the scrape had it.
func (m Metrics) Get(name string, labels ...string) (float64, bool) {
	v, ok := m[sampleKey(name, labels...)]
	return v, ok
}

// Value returns the value of the sample, 0 if missing.
func (m Metrics) Value(name string, labels ...string) float64 {
	v, _ := m.Get(name, labels...)
	return v
}

// Names lists the metric families of the scrape.
func (m Metrics) Names() []string {
	var names []string
	for k := range m {
		name, _, _ := strings.Cut(k, "{")
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			name = strings.TrimSuffix(name, suffix)
		}
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

func sampleKey(name string, labels ...string) string {
	if len(labels) == 0 {
		return name
	}
	pairs := make([]string, 0, len(labels)/2)
	for i := 0; i+1 < len(labels); i += 2 {
		pairs = append(pairs, fmt.Sprintf("%s=%q", labels[i], labels[i+1]))
	}
	slices.Sort(pairs)
	return name + "{" + strings.Join(pairs, ",") + "}"
}

// Scrape reads http://addr/metrics.
func Scrape(t testing.TB, addr string) Metrics {
	t.Helper()
	m, err := scrape(addr)
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	return m
}

func scrape(addr string) (Metrics, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("%s: %s", resp.Status, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	out := Metrics{}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName(), l.GetValue())
			}
			switch {
			case m.Counter != nil:
				out[sampleKey(name, labels...)] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[sampleKey(name, labels...)] = m.GetGauge().GetValue()
			case m.Histogram != nil:
				h := m.GetHistogram()
				out[sampleKey(name+"_count", labels...)] = float64(h.GetSampleCount())
				out[sampleKey(name+"_sum", labels...)] = h.GetSampleSum()
			case m.Untyped != nil:
				out[sampleKey(name, labels...)] = m.GetUntyped().GetValue()
			}
		}
	}
	return out, nil
}

// AwaitMetrics scrapes addr until cond holds of a scrape, and returns that
// scrape; it fails the test after timeout, showing the last one.
func AwaitMetrics(t testing.TB, addr string, timeout time.Duration, what string, cond func(Metrics) bool) Metrics {
	t.Helper()
	var last Metrics
	var lastErr error
	ok := Eventually(timeout, func() bool {
		last, lastErr = scrape(addr)
		return lastErr == nil && cond(last)
	})
	if !ok {
		t.Fatalf("waited %s for %s; last scrape error %v; last scrape:\n%v", timeout, what, lastErr, last)
	}
	return last
}

// HTTPStatus GETs http://addr/path and returns the status code and body.
func HTTPStatus(t testing.TB, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatalf("GET %s%s: %v", addr, path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// AwaitStatus GETs http://addr/path until it answers want, and returns
// that answer's body; it fails the test after 30 seconds.
func AwaitStatus(t testing.TB, addr, path string, want int) string {
	t.Helper()
	var body string
	WaitFor(t, 30*time.Second, fmt.Sprintf("%s to answer %d", path, want), func() bool {
		var code int
		code, body = HTTPStatus(t, addr, path)
		return code == want
	})
	return body
}
