package release_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The repository's modules: the relay, and the libraries applications
// require on their own.
const (
	relayPath  = "github.com/outboxrelay/outboxrelay"
	outboxPath = relayPath + "/outbox"
	inboxPath  = relayPath + "/inbox"
)

// goMod is what `go mod edit -json` prints of a go.mod file.
type goMod struct {
	Module  struct{ Path string }
	Go      string
	Require []struct{ Path, Version string }
	Replace []struct{ Old struct{ Path string } }
}

// required is the version m requires of path ("" if none).
func (m goMod) required(path string) string {
	for _, r := range m.Require {
		if r.Path == path {
			return r.Version
		}
	}
	return ""
}

// goTool runs the go command as an application's developer would, outside
// this workspace: modules come from a module proxy, and this repository's
// only from the file-based one the test writes.
type goTool struct {
	t   *testing.T
	env []string
	bin string // where go install puts commands (GOBIN)
}

// newGoTool's environment: no workspace, this go command only, the test's
// proxy first and then the module cache's downloads, so the network is
// asked only for what this machine never downloaded; a module cache of its
// own, so that no earlier run's zip of the same version is reused; no
// checksum database for modules nobody has published.
func newGoTool(t *testing.T, proxy string) goTool {
	t.Helper()
	cache := strings.TrimSpace(run(t, nil, ".", "env", "GOMODCACHE"))
	upstream := strings.TrimSpace(run(t, nil, ".", "env", "GOPROXY"))
	bin := t.TempDir()
	env := append(os.Environ(),
		"GOWORK=off", "GOTOOLCHAIN=local", "GOFLAGS=-mod=mod -modcacherw",
		"GOPROXY=file://"+proxy+",file://"+filepath.Join(cache, "cache", "download")+","+upstream,
		"GOMODCACHE="+t.TempDir(), "GONOSUMDB="+relayPath, "GOBIN="+bin)
	return goTool{t, env, bin}
}

func (g goTool) run(dir string, args ...string) string {
	g.t.Helper()
	return run(g.t, g.env, dir, args...)
}

// run runs the go command with args in dir (env nil: the test's own) and
// returns its standard output.
func run(t *testing.T, env []string, dir string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir, cmd.Env = dir, env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go %s (in %s):\n%s%s", strings.Join(args, " "), dir, out, stderr.Bytes())
	return string(out)
}

func readGoMod(t *testing.T, dir string) goMod {
	t.Helper()
	var m goMod
	require.NoError(t, json.Unmarshal([]byte(run(t, nil, ".", "mod", "edit", "-json", filepath.Join(dir, "go.mod"))), &m))
	return m
}

// modules is the module graph of the module in dir, path → version.
func (g goTool) modules(dir string) map[string]string {
	g.t.Helper()
	graph := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(g.run(dir, "list", "-m", "all")), "\n") {
		f := strings.Fields(line)
		graph[f[0]] = strings.Join(f[1:], " ")
	}
	return graph
}

// application writes a module of its own in a new folder (its go.mod
// requires only path at version, and main.go is source), tidies, builds
// and vets it, and returns its module graph.
func (g goTool) application(t *testing.T, goLine, path, version, source string) map[string]string {
	t.Helper()
	dir := t.TempDir()
	goMod := "module example.com/app\n\ngo " + goLine + "\n\nrequire " + path + " " + version + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(goMod), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(source), 0o644))
	g.run(dir, "mod", "tidy")
	g.run(dir, "build", "./...")
	g.run(dir, "vet", "./...")
	return g.modules(dir)
}

const writerApp = `package main

import (
	"fmt"

	"github.com/outboxrelay/outboxrelay/outbox"
)

func main() {
	var w outbox.Writer
	fmt.Println(w.Table)
}
`

const consumerApp = `package main

import (
	"fmt"

	"github.com/outboxrelay/outboxrelay/inbox"
)

func main() {
	_, err := inbox.New(inbox.Config{})
	fmt.Println(err)
}
`

// TestModulesResolveFromAProxyAsApplicationsUseThem publishes the three
// modules from the working tree into a file-based module proxy, at the
// version each go.mod requires of the others, and uses them as their users
// would: an application requiring only the producer library, one requiring
// only the inbox (tidy, build, vet, module graph), and `go install` of the
// relay's command at that version. Each go.mod names that real version
// and has no replace directive: those are ignored outside the main module,
// and `go install …@version` refuses a module that has them.
func TestModulesResolveFromAProxyAsApplicationsUseThem(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	relay, outbox, inbox := readGoMod(t, root), readGoMod(t, filepath.Join(root, "outbox")), readGoMod(t, filepath.Join(root, "inbox"))
	version := relay.required(outboxPath)
	require.NotEmpty(t, version, "the relay's go.mod requires the producer library")
	require.Equal(t, version, relay.required(inboxPath), "the relay requires the inbox at the libraries' version")
	require.Equal(t, version, inbox.required(outboxPath), "the inbox requires the producer library at its version")
	for name, m := range map[string]goMod{"the relay's": relay, "outbox/": outbox, "inbox/": inbox} {
		require.Empty(t, m.Replace, "%s go.mod has replace directives", name)
	}

	proxy := t.TempDir()
	writeProxy(t, proxy, []published{
		{relayPath, root, version},
		{outboxPath, filepath.Join(root, "outbox"), version},
		{inboxPath, filepath.Join(root, "inbox"), version},
	})
	g := newGoTool(t, proxy)

	t.Run("an application of the producer library", func(t *testing.T) {
		graph := g.application(t, outbox.Go, outboxPath, version, writerApp)
		require.Equal(t, version, graph[outboxPath])
		require.NotContains(t, graph, relayPath, "the relay's module is in the graph")
		require.NotContains(t, graph, inboxPath, "the inbox is in the graph")
	})
	t.Run("an application of the inbox", func(t *testing.T) {
		graph := g.application(t, inbox.Go, inboxPath, version, consumerApp)
		require.Equal(t, version, graph[inboxPath])
		require.Equal(t, version, graph[outboxPath], "the inbox chains the producer library")
		require.NotContains(t, graph, relayPath, "the relay's module is in the graph")
	})
	t.Run("go install of the relay", func(t *testing.T) {
		g.run(t.TempDir(), "install", relayPath+"/cmd/outboxrelay@"+version)
		out, err := exec.Command(filepath.Join(g.bin, "outboxrelay"), "--help").CombinedOutput()
		require.NoError(t, err, "%s", out)
		require.Contains(t, string(out), "Usage: outboxrelay")
	})
}
