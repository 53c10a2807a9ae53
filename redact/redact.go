package redact

import (
	"cmp"
	"net/url"
	"regexp"
	"slices"
	"strings"
)

// Mask replaces a password, as net/url's URL.Redacted does.
const Mask = "xxxxx"

// Unparsable stands for a URL that cannot be parsed, and so cannot be
// shown without the risk of showing its password.
const Unparsable = "(unparsable URL)"

// URL returns raw with its password replaced by [Mask], for logs and
// errors. A string that does not parse as a URL with a scheme (a
// keyword/value DSN such as "host=db password=…" among them) becomes
// [Unparsable] as a whole. A comma-separated list of URLs is redacted
// element by element and joined with commas; a comma starts a new
// element only where a scheme and "://" follow it, so the commas of a
// multi-host PostgreSQL URL ("postgres://u:p@h1:5432,h2:5432/db") stay
// inside their URL.
func URL(raw string) string {
	elems := split(raw)
	for i, e := range elems {
		u, err := url.Parse(e)
		if err != nil || u.Scheme == "" {
			elems[i] = Unparsable
			continue
		}
		elems[i] = u.Redacted()
	}
	return strings.Join(elems, ",")
}

// Error returns err with every password that raw holds replaced by
// [Mask] in its text, whatever the library put in the text: raw is one
// URL or a comma-separated list of them (as for [URL]), and each password
// is matched as written in raw, decoded, and query- or path-escaped. It
// returns nil for nil, and err itself when its text holds no password.
//
// The returned error unwraps to err, so errors.Is and errors.As still find
// what err wraps. What they find carries the original text: log or wrap
// the returned error, never the one errors.As extracts from it.
func Error(err error, raw string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	scrubbed := passwords(raw).Replace(msg)
	if scrubbed == msg {
		return err
	}
	return &scrubbedError{msg: scrubbed, err: err}
}

// scrubbedError is an error whose text has had its passwords masked.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// elementStart matches a comma that starts a new URL of a list: one
// followed, after optional blanks, by a scheme (RFC 3986) and "://".
var elementStart = regexp.MustCompile(`,\s*[A-Za-z][A-Za-z0-9+.-]*://`)

// split cuts a comma-separated list of URLs into its elements, trimmed
// of surrounding blanks; a single URL is a list of one. A password may
// hold a comma, but never "://" (its slashes would have to be escaped),
// so no cut falls inside a parsable URL's user information.
func split(raw string) []string {
	var elems []string
	start := 0
	for _, m := range elementStart.FindAllStringIndex(raw, -1) {
		elems = append(elems, strings.TrimSpace(raw[start:m[0]]))
		start = m[0] + 1
	}
	return append(elems, strings.TrimSpace(raw[start:]))
}

// passwords returns a replacer that masks every password of the URLs in
// raw, in each of the forms a library might quote it in.
func passwords(raw string) *strings.Replacer {
	var forms []string
	add := func(s string) {
		if s != "" && !slices.Contains(forms, s) {
			forms = append(forms, s)
		}
	}
	for _, e := range split(raw) {
		written := writtenPassword(e)
		decoded, ok := "", false
		if u, err := url.Parse(e); err == nil {
			if u.User == nil {
				continue
			}
			decoded, ok = u.User.Password()
		} else if written != "" {
			// An unparsable URL may still be quoted: take its password
			// as written, decoded where it decodes.
			decoded, err = url.PathUnescape(written)
			ok = err == nil
		}
		add(written)
		if ok {
			add(decoded)
			add(url.QueryEscape(decoded))
			add(url.PathEscape(decoded))
			add(strings.TrimPrefix(url.UserPassword("", decoded).String(), ":")) // escaped as user information
		}
	}
	// At each position of the text, strings.Replacer tries its pairs in
	// order: longest first, so no form is masked only in part by a
	// shorter one it contains.
	slices.SortFunc(forms, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	pairs := make([]string, 0, 2*len(forms))
	for _, f := range forms {
		pairs = append(pairs, f, Mask)
	}
	return strings.NewReplacer(pairs...)
}

// writtenPassword returns the password of a URL as written in it, between
// the first colon of its user information and the last "@" of what
// follows "://" (where net/url would find it), or "" if it has none. It
// does not need the URL to parse.
func writtenPassword(elem string) string {
	_, rest, ok := strings.Cut(elem, "://")
	if !ok {
		return ""
	}
	if end := strings.IndexAny(rest, "/?"); end >= 0 && strings.LastIndex(rest[:end], "@") >= 0 {
		rest = rest[:end] // the authority, when it ends before a path or query
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return ""
	}
	_, pw, _ := strings.Cut(rest[:at], ":")
	return pw
}
