package outbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"go/version"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// The library is a module of its own so that an application that writes
// events pulls in nothing of the relay: these tests build such an
// application and read module graphs with the go command.

const (
	libraryPath = "github.com/outboxrelay/outboxrelay/outbox"
	relayPath   = "github.com/outboxrelay/outboxrelay"
)

// apiModules are the modules the library may require: pgx, the
// OpenTelemetry API (not its SDK, exporters or bridges) and google/uuid
// (event ids; it requires nothing).
var apiModules = map[string]bool{
	"github.com/jackc/pgx/v5":         true,
	"github.com/google/uuid":          true,
	"go.opentelemetry.io/otel":        true,
	"go.opentelemetry.io/otel/trace":  true,
	"go.opentelemetry.io/otel/metric": true,
}

// goMod is what `go mod edit -json` prints of a go.mod file.
type goMod struct {
	Module  struct{ Path string }
	Go      string
	Require []struct {
		Path, Version string
		Indirect      bool
	}
}

// goTool runs the go command that runs the tests.
type goTool struct {
	t   *testing.T
	bin string
	env []string
}

func newGoTool(t *testing.T) goTool {
	t.Helper()
	bin, err := exec.LookPath("go")
	must(t, err, "these tests run the go command")
	// No workspace, and no other toolchain: a go line newer than this one
	// must fail, not download one. The module proxy stays reachable: a
	// fresh machine's module cache lacks what the application needs.
	env := append(os.Environ(), "GOWORK=off", "GOTOOLCHAIN=local")
	return goTool{t, bin, env}
}

// run runs go with args in dir and returns its standard output.
func (g goTool) run(dir string, args ...string) string {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, g.bin, args...)
	cmd.Dir, cmd.Env = dir, g.env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		g.t.Fatalf("go %s (in %s): %v\n%s%s", strings.Join(args, " "), dir, err, out, stderr.Bytes())
	}
	return string(out)
}

// set runs go with args in dir and returns the first field of each line
// of its output.
func (g goTool) set(dir string, args ...string) map[string]bool {
	g.t.Helper()
	set := map[string]bool{}
	for _, line := range strings.Split(g.run(dir, args...), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			set[f[0]] = true
		}
	}
	return set
}

// modules is the module graph of the module in dir: every module path
// `go list -m all` lists.
func (g goTool) modules(dir string) map[string]bool {
	g.t.Helper()
	return g.set(dir, "list", "-m", "all")
}

// modFile reads the go.mod file at path.
func (g goTool) modFile(path string) goMod {
	g.t.Helper()
	var m goMod
	must(g.t, json.Unmarshal([]byte(g.run(".", "mod", "edit", "-json", path)), &m), "decode go mod edit -json "+path)
	return m
}

// relayModFile reads the relay's go.mod at path. The relay needs a newer
// Go than the library, and a go command older than the relay's go line
// (testing the library at the Go it declares) cannot parse it: then it
// returns why not instead. Any other failure fails the test.
func (g goTool) relayModFile(path string) (goMod, string) {
	g.t.Helper()
	b, err := os.ReadFile(path)
	must(g.t, err, "read the relay's go.mod")
	goLine := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(b)
	if goLine == nil {
		g.t.Fatalf("%s has no go line", path)
	}
	ours := strings.Fields(g.run(".", "env", "GOVERSION"))[0]
	if relayGo := "go" + string(goLine[1]); version.IsValid(ours) && version.Compare(ours, relayGo) < 0 {
		return goMod{}, fmt.Sprintf("this go command (%s) is older than the relay's go line (%s) and cannot read its go.mod", ours, relayGo)
	}
	m := g.modFile(path)
	equal(g.t, "the relay's module path", m.Module.Path, relayPath)
	return m, ""
}

// newModule writes a module in a new temporary directory: its go.mod, a
// go.sum (the library's, so what it shares is verified against the same
// sums) and main.go.
func newModule(t *testing.T, goMod string, main []byte) string {
	t.Helper()
	dir := t.TempDir()
	sum, err := os.ReadFile("go.sum")
	must(t, err, "read the library's go.sum")
	must(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(goMod), 0o644), "write go.mod")
	must(t, os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644), "write go.sum")
	must(t, os.WriteFile(filepath.Join(dir, "main.go"), main, 0o644), "write main.go")
	return dir
}

// The library's go.mod requires pgx, google/uuid and the OpenTelemetry
// API, and nothing else but what they need: neither its code nor its tests import
// anything more (an assertion module for the tests would be in every
// application's graph).
func TestLibraryRequiresOnlyPgxUUIDAndTheOpenTelemetryAPI(t *testing.T) {
	t.Parallel()
	g := newGoTool(t)
	lib := g.modFile("go.mod")
	equal(t, "module path", lib.Module.Path, libraryPath)
	for _, r := range lib.Require {
		if !r.Indirect && !apiModules[r.Path] {
			t.Errorf("go.mod requires %s %s directly; the library may import pgx, google/uuid and the OpenTelemetry API only", r.Path, r.Version)
		}
	}
}

// A fresh application module that requires only the library (through a
// replace to this directory, as it would require a tagged version) builds
// at the go version the library declares, writes its events with pgx and
// database/sql, and its module graph holds nothing of the relay: neither
// the relay's module nor any module the relay requires directly, except
// pgx and the OpenTelemetry API and what their own go.mod files list.
func TestApplicationModuleNeedsOnlyTheLibrary(t *testing.T) {
	t.Parallel()
	g := newGoTool(t)
	library, err := filepath.Abs(".")
	must(t, err, "the library's directory")
	lib := g.modFile(filepath.Join(library, "go.mod"))
	relay, unread := g.relayModFile(filepath.Join(library, "..", "go.mod"))

	// The application: testdata/app/main.go in a module of its own.
	main, err := os.ReadFile(filepath.Join("testdata", "app", "main.go"))
	must(t, err, "read the application")
	app := newModule(t, fmt.Sprintf("module example.com/app\n\ngo %s\n\nrequire %s v0.0.0\n\nreplace %s => %s\n",
		lib.Go, libraryPath, libraryPath, library), main)
	g.run(app, "mod", "tidy")
	g.run(app, "build", "-o", "app", ".")

	// It writes its committed events, each with its span's traceparent.
	databaseURL, pool := newOutbox(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(app, "app"), databaseURL)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	must(t, err, "run the application: "+stderr.String())
	traceparent := strings.TrimSpace(string(out))
	if !regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`).MatchString(traceparent) {
		t.Fatalf("the application printed %q, want a traceparent", out)
	}
	equal(t, "the committed events, not the rolled-back ones", readRows(t, pool, "outbox", outboxCols), []storedRow{
		{AggregateType: "order", AggregateID: "1", EventType: "created", Payload: `{"id": 1}`,
			Headers: ptr(fmt.Sprintf(`{"traceparent": %q}`, traceparent))},
		{AggregateType: "order", AggregateID: "1", EventType: "paid", Payload: `{"id": 1}`,
			Headers: ptr(fmt.Sprintf(`{"tenant": "acme", "traceparent": %q}`, traceparent))},
		{AggregateType: "order", AggregateID: "2", EventType: "created", Payload: `{"id": 2}`,
			Headers: ptr(fmt.Sprintf(`{"traceparent": %q}`, traceparent))},
	})

	graph := g.modules(app)
	built := g.set(app, "list", "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", ".")
	baseline := apiBaseline(t, g, lib)

	// Nothing of the relay.
	if graph[relayPath] {
		t.Errorf("the application's module graph holds the relay's module %s", relayPath)
	}
	if unread != "" {
		t.Logf("%s: the checks against the relay's requirements are skipped, the others run", unread)
	}
	var throughAPI []string
	for _, r := range relay.Require {
		if r.Indirect || apiModules[r.Path] || r.Path == libraryPath {
			continue
		}
		if built[r.Path] {
			t.Errorf("the application builds packages of %s, which the relay requires", r.Path)
		}
		switch {
		case !graph[r.Path]:
		case baseline[r.Path]:
			throughAPI = append(throughAPI, r.Path)
		default:
			t.Errorf("the application's module graph holds %s, which the relay requires: the library brings it", r.Path)
		}
	}
	if len(throughAPI) > 0 {
		t.Logf("in the graph because the go.mod files of pgx and the OpenTelemetry API (or of their dependencies) list them, and not built: %s",
			strings.Join(throughAPI, ", "))
	}
	// Nothing at all that pgx and the OpenTelemetry API do not bring.
	for m := range graph {
		if m != "example.com/app" && m != libraryPath && !baseline[m] {
			t.Errorf("the library brings %s into the application's module graph; pgx and the OpenTelemetry API alone do not", m)
		}
	}

	// Its go.mod: the go line the library declares (no dependency needs a
	// newer one), and the library and modules of the library's own graph.
	appMod := g.modFile(filepath.Join(app, "go.mod"))
	equal(t, "the application's go line after go mod tidy", appMod.Go, lib.Go)
	libGraph := g.modules(library)
	var requires []string
	for _, r := range appMod.Require {
		requires = append(requires, r.Path)
		if r.Path != libraryPath && !libGraph[r.Path] {
			t.Errorf("the application's go.mod requires %s, which is not in the library's module graph", r.Path)
		}
	}
	if !slices.Contains(requires, libraryPath) {
		t.Errorf("the application's go.mod does not require the library: %s", requires)
	}
}

// apiBaseline is the module graph of an application that uses pgx and the
// OpenTelemetry API without the library: a module that imports the
// packages of theirs that the library and its tests import, at the versions
// the library requires. Whatever else an application's graph holds, the
// library brought.
func apiBaseline(t *testing.T, g goTool, lib goMod) map[string]bool {
	t.Helper()
	var imports []string
	for _, p := range strings.Fields(g.run(".", "list", "-f", `{{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}`, ".")) {
		if first, _, _ := strings.Cut(p, "/"); strings.Contains(first, ".") && p != libraryPath && !strings.HasPrefix(p, libraryPath+"/") {
			imports = append(imports, p)
		}
	}
	slices.Sort(imports)
	imports = slices.Compact(imports)
	var src strings.Builder
	src.WriteString("package main\n\nimport (\n")
	for _, line := range strings.Split(strings.TrimSpace(g.run(".", append([]string{"list", "-f", "{{.ImportPath}} {{.Module.Path}}"}, imports...)...)), "\n") {
		if pkg, module, _ := strings.Cut(line, " "); apiModules[module] {
			fmt.Fprintf(&src, "\t_ %q\n", pkg)
		}
	}
	src.WriteString(")\n\nfunc main() {}\n")
	var mod strings.Builder
	fmt.Fprintf(&mod, "module example.com/baseline\n\ngo %s\n\n", lib.Go)
	for _, r := range lib.Require {
		if apiModules[r.Path] {
			fmt.Fprintf(&mod, "require %s %s\n", r.Path, r.Version)
		}
	}
	dir := newModule(t, mod.String(), []byte(src.String()))
	g.run(dir, "mod", "tidy")
	return g.modules(dir)
}
