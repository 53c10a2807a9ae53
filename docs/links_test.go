package docs_test

import (
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/require"
)

// TestLinksResolve checks every relative link in the repository's Markdown
// (README.md, CHANGELOG.md, CONTRIBUTING.md, docs/…): the file or folder it
// names exists, and an anchor, in another page or the same one, names a
// heading (by GitHub's slug rules) or an explicit id of that page.
func TestLinksResolve(t *testing.T) {
	t.Parallel()
	files := markdownFiles(t, "..")
	for _, want := range []string{"README.md", "CHANGELOG.md", "CONTRIBUTING.md", "docs/operations.md"} {
		require.Contains(t, files, filepath.Join("..", want), "the walk finds %s", want)
	}
	c := newChecker()
	var broken []string
	for _, f := range files {
		problems, err := c.check(f)
		require.NoError(t, err)
		broken = append(broken, problems...)
	}
	require.Empty(t, broken, "broken links")
}

// TestBrokenFixtureFails proves the checker finds what it must: a missing
// file, a missing anchor in another page and a missing anchor in the same
// page, and nothing inside code.
func TestBrokenFixtureFails(t *testing.T) {
	t.Parallel()
	problems, err := newChecker().check(filepath.Join("testdata", "broken.md"))
	require.NoError(t, err)
	var targets []string
	for _, p := range problems {
		targets = append(targets, strings.Fields(p)[1])
	}
	require.Equal(t, []string{"missing.md", "target.md#no-such-heading", "#nowhere", "#duplicate-2"}, targets, problems)
}

func TestSlug(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ heading, slug string }{
		{"Quick start", "quick-start"},
		{"An existing outbox table: the drop-in SQL", "an-existing-outbox-table-the-drop-in-sql"},
		{"`--sysmon-awake` re-exec", "--sysmon-awake-re-exec"},
		{"0006: The Go runtime's system monitor (`--sysmon-awake`)", "0006-the-go-runtimes-system-monitor---sysmon-awake"},
		{"Keep a Changelog — 1.1.0", "keep-a-changelog--110"},
		{"[Several brokers](deployment.md) and more", "several-brokers-and-more"},
		{`<a id="alert-x"></a>Runbook: OutboxVacuumHorizonHeld`, "runbook-outboxvacuumhorizonheld"},
		{"snake_case name", "snake_case-name"},
		{"Straße über", "straße-über"},
		{"**Bold** and *em*", "bold-and-em"},
	} {
		require.Equal(t, tc.slug, slug(tc.heading), tc.heading)
	}
}

func TestAnchorsNumberDuplicateHeadings(t *testing.T) {
	t.Parallel()
	page := "# Title\n\n## Results\n\n```\n## Results\n```\n\n## Results\n\n### Results\n\nA <a id=\"custom\"></a> anchor.\n"
	require.Equal(t, map[string]bool{"title": true, "results": true, "results-1": true, "results-2": true, "custom": true},
		anchors(page))
}

// markdownFiles lists the *.md files under root, leaving out Git's data,
// test fixtures and vendored or installed dependencies.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "testdata", "vendor", "node_modules":
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(d.Name(), ".md") {
			files = append(files, path)
		}
		return nil
	})
	require.NoError(t, err)
	return files
}

// checker checks the links of Markdown files, reading each target's
// anchors once.
type checker struct {
	anchors map[string]map[string]bool // by cleaned path
}

func newChecker() *checker { return &checker{anchors: map[string]map[string]bool{}} }

var (
	// inlineLink finds the target of an inline link or image: ](target)
	// or ](target "title").
	inlineLink = regexp.MustCompile(`\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	// refLink is a reference definition: [label]: target.
	refLink = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?`)
	scheme  = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// check returns a line per broken link of the file at path:
// "path:line: target (reason)".
func (c *checker) check(path string) ([]string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var problems []string
	for n, line := range proseLines(string(raw)) {
		if line == "" {
			continue
		}
		line = stripCodeSpans(line)
		var targets []string
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			targets = append(targets, m[1])
		}
		if m := refLink.FindStringSubmatch(line); m != nil {
			targets = append(targets, m[1])
		}
		for _, target := range targets {
			if reason := c.resolve(path, target); reason != "" {
				problems = append(problems, fmt.Sprintf("%s:%d: %s (%s)", path, n+1, target, reason))
			}
		}
	}
	return problems, nil
}

// resolve returns why target, a link in the file at from, does not
// resolve, or "" when it does or is not a relative link.
func (c *checker) resolve(from, target string) string {
	if scheme.MatchString(target) || strings.HasPrefix(target, "//") {
		return "" // an absolute URL: http, https, mailto
	}
	file, anchor, _ := strings.Cut(target, "#")
	path := from
	if file != "" {
		unescaped, err := url.PathUnescape(file)
		if err != nil {
			return "bad escape"
		}
		path = filepath.Join(filepath.Dir(from), filepath.FromSlash(unescaped))
		info, err := os.Stat(path)
		if err != nil {
			return "no such file"
		}
		if info.IsDir() || !strings.HasSuffix(path, ".md") {
			return "" // an anchor into a folder or a non-Markdown file is not checked
		}
	}
	if anchor == "" {
		return ""
	}
	want, err := url.PathUnescape(anchor)
	if err != nil {
		return "bad escape"
	}
	have, err := c.anchorsOf(path)
	if err != nil {
		return err.Error()
	}
	if !have[want] {
		return "no such anchor"
	}
	return ""
}

func (c *checker) anchorsOf(path string) (map[string]bool, error) {
	key := filepath.Clean(path)
	if a, ok := c.anchors[key]; ok {
		return a, nil
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	a := anchors(string(raw))
	c.anchors[key] = a
	return a, nil
}

var (
	heading  = regexp.MustCompile(`^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$`)
	htmlID   = regexp.MustCompile(`<[a-zA-Z][^>]*\s(?:id|name)="([^"]+)"`)
	htmlTag  = regexp.MustCompile(`<[^>]*>`)
	linkText = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
)

// anchors returns the anchors a page has: its headings' slugs, numbered as
// GitHub numbers repeats (x, x-1, x-2), and the ids and names of its HTML
// elements.
func anchors(page string) map[string]bool {
	have := map[string]bool{}
	seen := map[string]int{}
	for _, line := range proseLines(page) {
		for _, m := range htmlID.FindAllStringSubmatch(line, -1) {
			have[m[1]] = true
		}
		m := heading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s := slug(m[2])
		if n := seen[s]; n > 0 {
			have[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			have[s] = true
		}
		seen[s]++
	}
	return have
}

// slug is GitHub's anchor for a heading's text: the text as rendered
// (links as their text, HTML tags dropped), lowercased, every character
// but letters, digits, hyphens, underscores and spaces dropped, and spaces
// made hyphens.
func slug(text string) string {
	text = linkText.ReplaceAllString(text, "$1")
	text = htmlTag.ReplaceAllString(text, "")
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(text)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// proseLines returns the page's lines with those inside fenced code blocks
// (``` or ~~~, indented or not) blanked, so that line numbers stay true.
func proseLines(page string) []string {
	lines := strings.Split(page, "\n")
	fence := ""
	for i, line := range lines {
		trimmed := strings.TrimLeft(line, " \t")
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]+" \t") == "" {
				fence = ""
			}
			lines[i] = ""
			continue
		}
		for _, f := range []string{"```", "~~~"} {
			if strings.HasPrefix(trimmed, f) {
				fence = trimmed[:len(trimmed)-len(strings.TrimLeft(trimmed, f[:1]))]
				lines[i] = ""
			}
		}
	}
	return lines
}

// stripCodeSpans blanks the inline code spans of a line (between equal runs
// of backticks), so that a link shown as code is not checked.
func stripCodeSpans(line string) string {
	b := []byte(line)
	for i := 0; i < len(b); {
		if b[i] != '`' {
			i++
			continue
		}
		n := 0
		for i+n < len(b) && b[i+n] == '`' {
			n++
		}
		ticks := strings.Repeat("`", n)
		end := strings.Index(string(b[i+n:]), ticks)
		if end < 0 {
			i += n
			continue
		}
		stop := i + n + end + n
		for j := i; j < stop; j++ {
			b[j] = ' '
		}
		i = stop
	}
	return string(b)
}
