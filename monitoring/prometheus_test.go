package monitoring_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// job is the scrape job the dashboard and the alerts expect.
const job = "outboxrelay"

// client talks to the relay's and Prometheus's HTTP endpoints, without
// keeping connections that would outlive the test.
var client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// TestDashboardAndAlertsQueryWhatTheRelayExports runs a real relay and a
// real Prometheus scraping it, with good events and an event dead-lettered
// for its missing exchange, and evaluates every dashboard query and every
// alert expression through Prometheus's API. Each must name only metrics
// the relay exports (or up) and return data; each alert is evaluated
// without its comparison (absent(x): x), since the alerts rightly do not
// fire here. The dead-letter alert must fire, and no rule may fail to
// evaluate.
func TestDashboardAndAlertsQueryWhatTheRelayExports(t *testing.T) {
	t.Parallel()
	prometheusBin := tool(t, "prometheus")
	dir := t.TempDir()
	relayBin := buildRelay(t, dir)

	// The relay, in ordered mode so that it exports every metric
	// (outboxrelay_blocked_aggregates only exists there), on its own
	// database and exchange, with a queue that takes every routed event.
	databaseURL := testkit.NewDatabase(t)
	exchange := testkit.NewExchange(t)
	queue := testkit.NewQueue(t, exchange, "#")
	relayAddr := freeAddr(t)
	relay := testkit.StartProcess(t, relayBin, []string{
		"PATH=" + os.Getenv("PATH"),
		"DATABASE_URL=" + databaseURL,
		"AMQP_URL=" + testkit.AMQPURL(),
		"OUTBOX_EXCHANGE=" + exchange,
		"OUTBOX_LOG_FORMAT=json",
		"OUTBOX_HTTP_ADDR=" + relayAddr,
		"OUTBOX_MAX_ATTEMPTS=1",
		"OUTBOX_ORDERING=aggregate",
		"OUTBOX_METRICS_SAMPLE_INTERVAL=1s",
	}, "run")
	awaitHTTP(t, relay, "http://"+relayAddr+"/readyz", "the relay ready")
	pool := testkit.NewPool(t, databaseURL)

	// Prometheus, scraping the relay every second and evaluating the
	// repository's alerts every second.
	alerts, err := filepath.Abs("prometheus/alerts.yml")
	require.NoError(t, err)
	config := filepath.Join(dir, "prometheus.yml")
	require.NoError(t, os.WriteFile(config, fmt.Appendf(nil, `global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - %q
scrape_configs:
  - job_name: %s
    static_configs:
      - targets: [%q]
`, alerts, job, relayAddr), 0o600))
	promAddr := freeAddr(t)
	prom := testkit.StartProcess(t, prometheusBin, []string{"PATH=" + os.Getenv("PATH")},
		"--config.file="+config,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+promAddr,
	)
	api := promAPI{t: t, base: "http://" + promAddr}
	awaitHTTP(t, prom, api.base+"/-/ready", "Prometheus ready")
	api.await(`up{job="outboxrelay"} == 1`, "a first scrape of the relay")

	// Events after that first scrape, so that every counter and histogram
	// moves between two scrapes: 20 that arrive, and one whose exchange
	// does not exist, dead-lettered at its first attempt.
	testkit.InsertEvents(t, pool, 20)
	testkit.Exec(t, pool, `INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, exchange)
		VALUES ('order', 'nowhere', 'created', '{}', $1)`, testkit.UniqueName("missing"))
	queue.Receive(t, 20, 30*time.Second)
	testkit.WaitFor(t, 30*time.Second, "the event with a missing exchange dead-lettered", func() bool {
		return testkit.QueryInt(t, pool, `SELECT count(*) FROM outbox WHERE status = 'failed'`) == 1
	})
	api.await(`outboxrelay_events_published_total{job="outboxrelay"} >= 20`, "the published events scraped")
	api.await(`outboxrelay_events_dead_lettered_total{job="outboxrelay", reason="missing_exchange"} >= 1`, "the dead letter scraped")
	api.await(`max(outboxrelay_outbox_events{job="outboxrelay", status="failed"}) >= 1`, "the table sampled after the dead letter")

	exported := exportedNames(t, relayAddr)
	exported["up"] = true

	// Every dashboard query, with the dashboard's variables filled in as
	// Grafana would.
	queries := dashboardQueries(t)
	require.NotEmpty(t, queries)
	named := map[string]bool{}
	for _, q := range queries {
		names := metricNames(q.expr)
		require.NotEmpty(t, names, "panel %q: %s names no metric", q.panel, q.expr)
		for _, n := range names {
			require.True(t, exported[n], "panel %q: %s names %s, which the relay does not export", q.panel, q.expr, n)
			named[n] = true
		}
		result := api.query(q.expr)
		require.NotEmpty(t, result, "panel %q: %s returns nothing", q.panel, q.expr)
		t.Logf("panel %q: %s = %s", q.panel, q.expr, result)
	}

	// Every alert, without its threshold: the series it compares exist.
	for _, r := range loadAlerts(t) {
		names := metricNames(r.Expr)
		require.NotEmpty(t, names, "%s names no metric", r.Alert)
		for _, n := range names {
			require.True(t, exported[n], "%s: %s names %s, which the relay does not export", r.Alert, r.Expr, n)
			named[n] = true
		}
		expr := underlying(r.Expr)
		require.NotEqual(t, strings.TrimSpace(r.Expr), expr, "%s: a comparison or absent() to take off", r.Alert)
		result := api.query(expr)
		require.NotEmpty(t, result, "%s: %s returns nothing", r.Alert, expr)
		t.Logf("%s: %s = %s", r.Alert, expr, result)
	}

	// Every metric named anywhere has been stored under the job.
	for n := range named {
		require.NotEmpty(t, api.query(n+`{job="outboxrelay"}`), "Prometheus has no %s", n)
	}

	// The rules evaluate without error, and the dead letter fires its
	// alert (it has no "for"), for its reason, and nothing else fires.
	api.await(`ALERTS{alertname="OutboxEventsDeadLettered", alertstate="firing", reason="missing_exchange"}`, "the dead-letter alert firing")
	firing := api.query(`ALERTS{alertstate="firing"}`)
	require.Len(t, firing, 1, "only the dead-letter alert fires: %s", firing)
	for _, r := range api.rules() {
		require.Equal(t, "ok", r.Health, "rule %s: %s", r.Name, r.LastError)
	}

	prom.Stop(30 * time.Second)
	relay.Stop(30 * time.Second)
}

// buildRelay builds the outboxrelay command into dir (without the race
// detector: the relay is what is watched here, not what is tested).
func buildRelay(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "outboxrelay")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/outboxrelay")
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build ./cmd/outboxrelay:\n%s", out)
	return bin
}

// freeAddr returns a loopback address with a port that was free a moment
// ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// awaitHTTP waits for url to answer 200, failing the test if the process
// serving it exits first or it does not within a minute.
func awaitHTTP(t *testing.T, p *testkit.Process, url, what string) {
	t.Helper()
	testkit.WaitFor(t, time.Minute, what, func() bool {
		select {
		case <-p.Done():
			t.Fatalf("exited (%v) before %s:\n%s", p.Err(), what, p.Out.String())
		default:
		}
		resp, err := client.Get(url)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode == http.StatusOK
	})
}

// exportedNames scrapes the relay's /metrics and returns the names of its
// series: a histogram's _bucket, _sum and _count, as PromQL sees them.
func exportedNames(t *testing.T, addr string) map[string]bool {
	t.Helper()
	resp, err := client.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	names := map[string]bool{}
	for name, f := range families {
		switch f.GetType().String() {
		case "HISTOGRAM", "GAUGE_HISTOGRAM":
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[name+s] = true
			}
		case "SUMMARY":
			names[name] = true
			names[name+"_sum"] = true
			names[name+"_count"] = true
		default:
			names[name] = true
		}
	}
	return names
}

// panelQuery is one target of a dashboard panel.
type panelQuery struct {
	panel, expr string
}

// dashboardQueries reads every panel's expressions from the dashboard,
// with its variables replaced as Grafana replaces them: $job by the job,
// $__rate_interval by a window that spans the test's scrapes.
func dashboardQueries(t *testing.T) []panelQuery {
	t.Helper()
	raw, err := os.ReadFile("grafana/dashboards/outboxrelay.json")
	require.NoError(t, err)
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Panels  []json.RawMessage
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &d))
	vars := strings.NewReplacer("$__rate_interval", "1m", "${job}", job, "$job", job)
	var out []panelQuery
	for _, p := range d.Panels {
		require.Empty(t, p.Panels, "row %q: no panels inside collapsed rows, so every panel is checked", p.Title)
		for _, tg := range p.Targets {
			expr := vars.Replace(tg.Expr)
			require.NotContains(t, expr, "$", "panel %q: a variable the test does not fill in", p.Title)
			out = append(out, panelQuery{p.Title, expr})
		}
	}
	return out
}

var (
	stringLiteral = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	labelMatchers = regexp.MustCompile(`\{[^}]*\}`)
	rangeWindow   = regexp.MustCompile(`\[[^\]]*\]`)
	grouping      = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	call          = regexp.MustCompile(`\b[a-zA-Z_][a-zA-Z0-9_]*\s*\(`)
	identifier    = regexp.MustCompile(`\b[a-zA-Z_:][a-zA-Z0-9_:]*\b`)
	keywords      = []string{"and", "or", "unless", "bool", "offset", "inf", "nan", "Inf", "NaN"}
)

// metricNames returns the metric names a PromQL expression selects: its
// identifiers once strings, label matchers, range windows, grouping
// labels, function and aggregation names and keywords are taken out.
func metricNames(expr string) []string {
	s := stringLiteral.ReplaceAllString(expr, " ")
	s = labelMatchers.ReplaceAllString(s, " ")
	s = rangeWindow.ReplaceAllString(s, " ")
	s = grouping.ReplaceAllString(s, " ")
	s = call.ReplaceAllString(s, " ")
	var names []string
	for _, id := range identifier.FindAllString(s, -1) {
		if !slices.Contains(keywords, id) && !slices.Contains(names, id) {
			names = append(names, id)
		}
	}
	slices.Sort(names)
	return names
}

func TestMetricNames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`up{job="outboxrelay"} == 0`, []string{"up"}},
		{`absent(up{job="outboxrelay"})`, []string{"up"}},
		{`max by (job) (outboxrelay_oldest_pending_age_seconds) > 300`, []string{"outboxrelay_oldest_pending_age_seconds"}},
		{`histogram_quantile(0.99, sum by (le) (rate(outboxrelay_event_lag_seconds_bucket{job="x"}[1m])))`, []string{"outboxrelay_event_lag_seconds_bucket"}},
		{`sum(rate(a_sum[5m])) / sum(rate(a_count[5m])) > 1e3`, []string{"a_count", "a_sum"}},
		{`sum(x) by (instance, reason) and on (instance) y offset 5m`, []string{"x", "y"}},
		{`sum by (reason) (increase(c_total{reason=~"a|b"}[10m])) > 0`, []string{"c_total"}},
	} {
		require.Equal(t, tc.want, metricNames(tc.expr), tc.expr)
	}
}

var (
	absentCall = regexp.MustCompile(`^absent\((.*)\)$`)
	comparison = regexp.MustCompile(`\s*(?:==|!=|>=|<=|>|<)\s*[0-9.e+-]+$`)
)

// underlying is an alert's expression without what makes it fire: the
// selector inside absent(), or the expression before its threshold.
func underlying(expr string) string {
	expr = strings.TrimSpace(expr)
	if m := absentCall.FindStringSubmatch(expr); m != nil {
		return m[1]
	}
	return comparison.ReplaceAllString(expr, "")
}
