package release_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// clone is a clone of the repository's committed HEAD in a new folder, in
// which the test may commit and tag, with the working tree's release
// script committed over HEAD's.
func clone(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "repo")
	git(t, root, "clone", "-q", "--no-hardlinks", root, dir)
	git(t, dir, "config", "user.email", "release-test@example.com")
	git(t, dir, "config", "user.name", "release test")
	script, err := os.ReadFile(filepath.Join(root, ".ci", "release"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".ci", "release"), script, 0o755))
	git(t, dir, "add", ".ci/release")
	if strings.TrimSpace(git(t, dir, "status", "--porcelain")) != "" {
		git(t, dir, "commit", "-q", "-m", "the working tree's release script")
	}
	return dir
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := exec.Command("git", append([]string{"-C", dir}, args...)...).CombinedOutput()
	require.NoError(t, err, "git %s: %s", strings.Join(args, " "), out)
	return string(out)
}

// release runs .ci/release in dir and returns its output and whether it
// succeeded.
func release(t *testing.T, dir string, args ...string) (string, bool) {
	t.Helper()
	out, err := exec.Command(filepath.Join(dir, ".ci", "release"), args...).CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf(".ci/release did not run: %v", err)
	}
	return string(out), err == nil
}

// edit rewrites the file at path in dir with f and commits it.
func edit(t *testing.T, dir, path string, f func(string) string) {
	t.Helper()
	file := filepath.Join(dir, filepath.FromSlash(path))
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(file, []byte(f(string(b))), 0o644))
	git(t, dir, "commit", "-q", "-am", "edit "+path)
}

// The release script tags the libraries and then the relay, at the
// version every go.mod requires, and refuses what would publish a broken
// release: a go.mod requiring another version, a replace directive, no
// changelog section, a tag that exists, changes not committed.
func TestReleaseScriptTagsTheLibrariesBeforeTheRelay(t *testing.T) {
	t.Parallel()
	dir := clone(t)
	version := readGoMod(t, dir).required(outboxPath)
	require.NotEmpty(t, version)
	section := "## [" + strings.TrimPrefix(version, "v") + "]"

	out, ok := release(t, dir, strings.TrimPrefix(version, "v"))
	require.False(t, ok, "a version without its v: %s", out)
	require.Contains(t, out, "give the version as vX.Y.Z")

	if !strings.Contains(readFile(t, dir, "CHANGELOG.md"), "\n"+section) {
		out, ok = release(t, dir, version)
		require.False(t, ok, "no changelog section: %s", out)
		require.Contains(t, out, "CHANGELOG.md has no section")
		edit(t, dir, "CHANGELOG.md", func(s string) string {
			return strings.Replace(s, "## [Unreleased]", "## [Unreleased]\n\n"+section+" - 2026-11-29", 1)
		})
	}

	edit(t, dir, "inbox/go.mod", func(s string) string {
		return strings.Replace(s, outboxPath+" "+version, outboxPath+" v0.0.9", 1)
	})
	out, ok = release(t, dir, version)
	require.False(t, ok, "the inbox requires another version: %s", out)
	require.Contains(t, out, "inbox/go.mod requires "+outboxPath+" v0.0.9, not "+version)
	git(t, dir, "revert", "--no-edit", "HEAD")

	edit(t, dir, "go.mod", func(s string) string { return s + "\nreplace " + outboxPath + " => ./outbox\n" })
	out, ok = release(t, dir, version)
	require.False(t, ok, "a replace directive: %s", out)
	require.Contains(t, out, "go.mod has a replace directive")
	git(t, dir, "revert", "--no-edit", "HEAD")

	require.NoError(t, os.WriteFile(filepath.Join(dir, "untracked"), nil, 0o644))
	out, ok = release(t, dir, version)
	require.False(t, ok, "changes not committed: %s", out)
	require.Contains(t, out, "the working tree has changes")
	require.NoError(t, os.Remove(filepath.Join(dir, "untracked")))

	out, ok = release(t, dir, version)
	require.True(t, ok, out)
	require.Equal(t, []string{"tagged outbox/" + version, "tagged inbox/" + version, "tagged " + version,
		"push them together: git push origin outbox/" + version + " inbox/" + version + " " + version},
		strings.Split(strings.TrimSpace(out), "\n"))
	head := strings.TrimSpace(git(t, dir, "rev-parse", "HEAD"))
	for _, tag := range []string{"outbox/" + version, "inbox/" + version, version} {
		require.Equal(t, head, strings.TrimSpace(git(t, dir, "rev-list", "-n", "1", tag)), "%s tags HEAD", tag)
	}

	out, ok = release(t, dir, version)
	require.False(t, ok, "tags that exist: %s", out)
	require.Contains(t, out, "the tag outbox/"+version+" exists already")
}

func readFile(t *testing.T, dir, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(path)))
	require.NoError(t, err)
	return string(b)
}
