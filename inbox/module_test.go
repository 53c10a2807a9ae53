package inbox_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The inbox is a module of its own so that a consuming service pulls in
// nothing of the relay: its module graph (what `go list -m all` prints, the
// modules a build of it may use) holds the producer library and no module
// of the relay's.
func TestModuleGraphHoldsNothingOfTheRelay(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-m", "all").CombinedOutput()
	require.NoError(t, err, "go list -m all: %s", out)
	var modules []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		modules = append(modules, strings.Fields(line)[0])
	}
	require.Equal(t, "github.com/outboxrelay/outboxrelay/inbox", modules[0], "the main module")
	require.Contains(t, modules, "github.com/outboxrelay/outboxrelay/outbox", "the producer library, for chaining")
	for _, m := range modules[1:] {
		if strings.HasPrefix(m, "github.com/outboxrelay/") {
			require.Equal(t, "github.com/outboxrelay/outboxrelay/outbox", m, "a module of the relay's in the inbox's graph")
		}
	}
}
