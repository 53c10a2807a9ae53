package release_test

import (
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

// published is a module as a release tags it: its path, its folder in the
// working tree and the version it is tagged at.
type published struct {
	path, dir, version string
}

// writeProxy lays out a file-based module proxy (the GOPROXY protocol's
// files, served by the go command from file://dir) holding each module of
// mods at its version, its zip made from its folder as the go command
// makes a module zip from the files git would commit (tracked, or
// untracked and not ignored), nested modules left out.
func writeProxy(t *testing.T, dir string, mods []published) {
	t.Helper()
	for _, m := range mods {
		escaped, err := module.EscapePath(m.path)
		require.NoError(t, err)
		at := filepath.Join(dir, filepath.FromSlash(escaped), "@v")
		require.NoError(t, os.MkdirAll(at, 0o755))
		goMod, err := os.ReadFile(filepath.Join(m.dir, "go.mod"))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(at, m.version+".mod"), goMod, 0o644))
		info, err := json.Marshal(struct {
			Version string
			Time    time.Time
		}{m.version, time.Now().UTC()})
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(at, m.version+".info"), info, 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(at, "list"), []byte(m.version+"\n"), 0o644))
		zip, err := os.Create(filepath.Join(at, m.version+".zip"))
		require.NoError(t, err)
		err = modzip.Create(zip, module.Version{Path: m.path, Version: m.version}, workingFiles(t, m.dir))
		require.NoError(t, zip.Close())
		require.NoError(t, err, "zip %s@%s from %s", m.path, m.version, m.dir)
	}
}

// workingFiles lists the files of the working tree under dir that git
// would commit: tracked (and not deleted), or untracked and not ignored.
func workingFiles(t *testing.T, dir string) []modzip.File {
	t.Helper()
	out, err := exec.Command("git", "-C", dir, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--deduplicate").Output()
	require.NoError(t, err, "git ls-files in %s", dir)
	var files []modzip.File
	for _, name := range strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00") {
		path := filepath.Join(dir, filepath.FromSlash(name))
		if _, err := os.Lstat(path); err != nil {
			continue // deleted in the working tree
		}
		files = append(files, workingFile{name: name, path: path})
	}
	return files
}

// workingFile is a file of the working tree, for modzip.Create. Files of
// nested modules are among them: Create leaves them out.
type workingFile struct{ name, path string }

func (f workingFile) Path() string                 { return f.name }
func (f workingFile) Lstat() (fs.FileInfo, error)  { return os.Lstat(f.path) }
func (f workingFile) Open() (io.ReadCloser, error) { return os.Open(f.path) }
