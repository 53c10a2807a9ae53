package cli_test

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/cli"
)

// TestJSONLogsWriteDurationsAsText: a JSON log line carries a duration as
// "5s", also inside a group, not as 5000000000.
func TestJSONLogsWriteDurationsAsText(t *testing.T) {
	var buf bytes.Buffer
	cli.LogFlags{LogFormat: "json", LogLevel: "info"}.Logger(&buf).
		WithGroup("config").Info("start", "poll_interval", 5*time.Second, "lease", 1500*time.Millisecond, "workers", 4)
	var line struct {
		Config map[string]any `json:"config"`
	}
	require.NoError(t, json.Unmarshal(buf.Bytes(), &line), buf.String())
	require.Equal(t, "5s", line.Config["poll_interval"])
	require.Equal(t, "1.5s", line.Config["lease"])
	require.Equal(t, float64(4), line.Config["workers"])
}
