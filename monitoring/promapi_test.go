package monitoring_test

import (
	"encoding/json"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// promAPI queries a Prometheus's HTTP API.
type promAPI struct {
	t    *testing.T
	base string
}

// sample is one series of an instant query's result.
type sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func (s sample) String() string { return fmt.Sprintf("%v %v", s.Metric, s.Value[1]) }

// get GETs path with the query parameters and decodes the API's data.
func (a promAPI) get(path string, params url.Values, data any) error {
	resp, err := client.Get(a.base + path + "?" + params.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return fmt.Errorf("%s: %s: %w", path, resp.Status, err)
	}
	if body.Status != "success" {
		return fmt.Errorf("%s: %s: %s", path, resp.Status, body.Error)
	}
	return json.Unmarshal(body.Data, data)
}

func (a promAPI) instant(expr string) ([]sample, error) {
	var data struct {
		ResultType string   `json:"resultType"`
		Result     []sample `json:"result"`
	}
	if err := a.get("/api/v1/query", url.Values{"query": {expr}}, &data); err != nil {
		return nil, err
	}
	if data.ResultType != "vector" {
		return nil, fmt.Errorf("%s: a %s, not an instant vector", expr, data.ResultType)
	}
	return data.Result, nil
}

// query evaluates expr now and returns its series, failing the test on an
// error (a query Prometheus rejects).
func (a promAPI) query(expr string) []sample {
	a.t.Helper()
	result, err := a.instant(expr)
	require.NoError(a.t, err, expr)
	return result
}

// await waits until expr returns a series.
func (a promAPI) await(expr, what string) {
	a.t.Helper()
	var lastErr error
	testkit.WaitFor(a.t, time.Minute, what+" ("+expr+")", func() bool {
		var result []sample
		result, lastErr = a.instant(expr)
		return lastErr == nil && len(result) > 0
	})
}

// ruleState is one rule as /api/v1/rules reports it.
type ruleState struct {
	Name      string `json:"name"`
	Health    string `json:"health"`
	LastError string `json:"lastError"`
}

// rules returns the state of every loaded rule, once each has been
// evaluated.
func (a promAPI) rules() []ruleState {
	a.t.Helper()
	var data struct {
		Groups []struct {
			Rules []ruleState `json:"rules"`
		} `json:"groups"`
	}
	testkit.WaitFor(a.t, time.Minute, "every rule evaluated", func() bool {
		require.NoError(a.t, a.get("/api/v1/rules", nil, &data))
		for _, g := range data.Groups {
			for _, r := range g.Rules {
				if r.Health == "unknown" {
					return false
				}
			}
		}
		return len(data.Groups) > 0
	})
	var out []ruleState
	for _, g := range data.Groups {
		out = append(out, g.Rules...)
	}
	require.Len(a.t, out, len(loadAlerts(a.t)), "Prometheus loaded every rule of alerts.yml")
	return out
}
