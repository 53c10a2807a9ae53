package monitoring_test

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

// tool returns the path of a Prometheus binary (promtool, prometheus),
// failing the test if it is not installed: these tests never skip.
func tool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not installed: run the tests with the test script, .ci/test, which installs it "+
			"(Debian's prometheus package: apt-get install prometheus)", name)
	}
	return p
}

// TestAlertRulesPassPromtool checks the rule file and the Prometheus
// configuration of the local stack, and runs the rules' unit tests.
func TestAlertRulesPassPromtool(t *testing.T) {
	t.Parallel()
	promtool := tool(t, "promtool")
	for _, args := range [][]string{
		{"check", "rules", "alerts.yml"},
		{"check", "config", "prometheus.yml"},
		{"test", "rules", "alerts_test.yml"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, promtool, args...)
		cmd.Dir = "prometheus"
		out, err := cmd.CombinedOutput()
		cancel()
		require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
	}
}

// ruleFile is a Prometheus rule file.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []rule `yaml:"rules"`
	} `yaml:"groups"`
}

type rule struct {
	Alert       string            `yaml:"alert"`
	Record      string            `yaml:"record"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// loadAlerts reads prometheus/alerts.yml.
func loadAlerts(t *testing.T) []rule {
	t.Helper()
	raw, err := os.ReadFile("prometheus/alerts.yml")
	require.NoError(t, err)
	var f ruleFile
	require.NoError(t, yaml.Unmarshal(raw, &f))
	var rules []rule
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	require.NotEmpty(t, rules)
	return rules
}

// The metrics only one relay at a time exports (the table gauges, the
// vacuum horizon's), or every relay exports with the same value (the
// notification queue): rules over them take the max across instances,
// by job and, if they like, by the metric's own labels.
var sampledMetrics = []string{
	"outboxrelay_outbox_events",
	"outboxrelay_oldest_pending_age_seconds",
	"outboxrelay_scheduled_events",
	"outboxrelay_blocked_aggregates",
	"outboxrelay_notification_queue_usage_ratio",
	"outboxrelay_vacuum_horizon_age_seconds",
	"outboxrelay_vacuum_horizon_age_transactions",
}

// maxByJob is the aggregation a rule over a sampled metric starts with:
// max by (job), or by (job, label, …).
func maxByJob(metric string) *regexp.Regexp {
	return regexp.MustCompile(`max by \(job(?:, [a-z_]+)*\) \(` + regexp.QuoteMeta(metric) + `\b`)
}

var runbook = regexp.MustCompile(`^https://github\.com/outboxrelay/outboxrelay/blob/main/docs/operations\.md#alert-[a-z]+$`)

// TestAlertRulesHaveSeverityRunbookAndTests checks what promtool does
// not: every alert has a severity, a summary, a description and a runbook
// in docs/operations.md; rules over the sampled gauges aggregate them with max; and
// alerts_test.yml shows every alert both firing and not firing.
func TestAlertRulesHaveSeverityRunbookAndTests(t *testing.T) {
	t.Parallel()
	rules := loadAlerts(t)

	raw, err := os.ReadFile("prometheus/alerts_test.yml")
	require.NoError(t, err)
	var tests struct {
		RuleFiles []string `yaml:"rule_files"`
		Tests     []struct {
			AlertRuleTest []struct {
				Alertname string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &tests))
	require.Equal(t, []string{"alerts.yml"}, tests.RuleFiles)
	firing, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				firing[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}

	var names []string
	for _, r := range rules {
		require.NotEmpty(t, r.Alert, "only alerting rules here: %q", r.Record)
		require.NotContains(t, names, r.Alert, "alert names are unique")
		names = append(names, r.Alert)
		require.Contains(t, []string{"warning", "critical"}, r.Labels["severity"], r.Alert)
		for _, a := range []string{"summary", "description"} {
			require.NotEmpty(t, strings.TrimSpace(r.Annotations[a]), "%s: annotation %s", r.Alert, a)
		}
		require.Regexp(t, runbook, r.Annotations["runbook"], "%s: runbook in docs/operations.md's Alerts table", r.Alert)
		for _, m := range sampledMetrics {
			if strings.Contains(r.Expr, m) {
				require.Regexp(t, maxByJob(m), r.Expr, "%s: %s comes from one relay, or from each: max across instances", r.Alert, m)
			}
		}
		require.True(t, firing[r.Alert], "alerts_test.yml shows %s firing", r.Alert)
		require.True(t, quiet[r.Alert], "alerts_test.yml shows %s not firing", r.Alert)
	}
	for name := range firing {
		require.True(t, slices.Contains(names, name), "alerts_test.yml tests an alert that does not exist: %s", name)
	}
}
