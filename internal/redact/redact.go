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

// Unparsable stands for a connection string that cannot be parsed, and so
// cannot be shown without the risk of showing its password.
const Unparsable = "(unparsable URL)"

// URL returns raw with its passwords replaced by [Mask], for logs and
// errors, and the rest as written:
//
//   - the password of the user information of a URL (user:pass@host);
//   - the values of its query parameters password and sslpassword
//     (?password=…, as PostgreSQL's libpq and pgx accept them; the name
//     is matched percent-decoded and in any case), up to the next "&",
//     a "#" included, as pgx reads it;
//   - the values of the keywords password and sslpassword of a
//     keyword/value DSN ("host=db password=secret", or
//     "password = 'a b\'c'"), quotes included.
//
// A string that is neither a URL with a scheme and "://" nor a
// keyword/value DSN becomes [Unparsable] as a whole, and so does a URL
// whose user information net/url and pgx would cut at different places
// (postgres://u:pw?d@h), where either might leave a password in what it
// shows. A comma-separated list of URLs is redacted element by element
// and joined with commas; a comma starts a new element only where a
// scheme and "://" follow it, so the commas of a multi-host PostgreSQL URL
// ("postgres://u:p@h1:5432,h2:5432/db") or a DSN stay inside it.
func URL(raw string) string {
	elems := split(raw)
	for i, e := range elems {
		if s, ok := redactURL(e); ok {
			elems[i] = s
		} else if s, ok := redactDSN(e); ok {
			elems[i] = s
		} else {
			elems[i] = Unparsable
		}
	}
	return strings.Join(elems, ",")
}

// Error returns err with every password that raw holds replaced by
// [Mask] in its text, whatever the library put in the text: raw is one
// URL or a comma-separated list of them, or a keyword/value DSN (as for
// [URL]), and each password (of the user information, of a password or
// sslpassword parameter or keyword) is matched as written in raw,
// decoded or unquoted, and query-, path- or userinfo-escaped. It returns
// nil for nil, and err itself when its text holds no password.
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

// schemeStart matches a URL's scheme (RFC 3986) and "://" at the start of
// a string, after optional blanks; elementStart matches a comma that
// starts a new URL of a list.
var (
	schemeStart  = regexp.MustCompile(`^\s*[A-Za-z][A-Za-z0-9+.-]*://`)
	elementStart = regexp.MustCompile(`,\s*[A-Za-z][A-Za-z0-9+.-]*://`)
)

// split cuts a comma-separated list of URLs into its elements, trimmed
// of surrounding blanks; a single URL, or anything that does not start
// with a scheme (a DSN, whose quoted values may hold anything), is a list
// of one. A password may hold a comma, but never "://" (its slashes would
// have to be escaped), so no cut falls inside a parsable URL's user
// information.
func split(raw string) []string {
	if !schemeStart.MatchString(raw) {
		return []string{strings.TrimSpace(raw)}
	}
	var elems []string
	start := 0
	for _, m := range elementStart.FindAllStringIndex(raw, -1) {
		elems = append(elems, strings.TrimSpace(raw[start:m[0]]))
		start = m[0] + 1
	}
	return append(elems, strings.TrimSpace(raw[start:]))
}

// redactURL is [URL] for one URL; ok is false if elem is not a URL with a
// scheme and "://", or one that cannot be shown safely.
func redactURL(elem string) (shown string, ok bool) {
	u, err := url.Parse(elem)
	if err != nil || u.Scheme == "" || u.Opaque != "" || !agreed(elem) {
		return "", false
	}
	// net/url cuts the fragment at the first "#", then the query at the
	// first "?"; whichever comes first ends what it parsed into u. The rest
	// is shown as written, with its password parameters masked: pgx reads a
	// "#" as part of a value, not as a fragment.
	i := strings.IndexAny(elem, "?#")
	if i < 0 {
		return u.Redacted(), true
	}
	u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = "", false, "", ""
	var b strings.Builder
	b.WriteString(u.Redacted())
	b.WriteString(elem[i : i+1])
	for k, pair := range strings.Split(elem[i+1:], "&") {
		if k > 0 {
			b.WriteByte('&')
		}
		if name, value, ok := secretParam(pair); ok && value != "" {
			pair = name + Mask
		}
		b.WriteString(pair)
	}
	return b.String(), true
}

// agreed reports whether net/url and pgx (or libpq) find the same user
// information in elem, as far as a password goes: net/url ends it at the
// last "@" before the first "/", "?" or "#", pgx at the first "@" before
// any "/". Where pgx's holds a password that net/url's does not contain
// (a "?" or "#" before the "@"), showing what net/url parsed could show
// that password.
func agreed(elem string) bool {
	_, rest, _ := strings.Cut(elem, "://")
	at := strings.IndexAny(rest, "@/")
	if at < 0 || rest[at] != '@' {
		return true
	}
	userinfo := rest[:at]
	return !strings.Contains(userinfo, ":") || !strings.ContainsAny(userinfo, "?#")
}

// secretParam finds in pair, one "&"-separated piece of a URL's query
// (and what follows it, fragment included), a parameter that holds a
// password: a name that starts pair or follows a "?" or "#" in it, and
// decodes to password or sslpassword in any case. It returns pair up to
// and including that name's "=", and the value: the rest of pair.
func secretParam(pair string) (name, value string, ok bool) {
	for start := 0; ; {
		key, v, found := strings.Cut(pair[start:], "=")
		if found && secretKey(percentDecode(key)) {
			return pair[:start+len(key)+1], v, true
		}
		next := strings.IndexAny(pair[start:], "?#")
		if next < 0 {
			return "", "", false
		}
		start += next + 1
	}
}

// secretKey reports whether a parameter or keyword names a password.
func secretKey(key string) bool {
	key = strings.TrimSpace(key)
	return strings.EqualFold(key, "password") || strings.EqualFold(key, "sslpassword")
}

// percentDecode decodes the %XX escapes of s that are well formed and
// leaves anything else (a "+" among them) as it is, as pgx does.
func percentDecode(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if c, err := url.PathUnescape(s[i : i+3]); err == nil {
				b.WriteString(c)
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// setting is one keyword=value of a keyword/value DSN; value is as
// written, quotes included.
type setting struct {
	key, value string
	at         int // where value starts in the DSN
}

// dsnKeyword is what a keyword of a keyword/value DSN may be.
var dsnKeyword = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// parseDSN cuts a keyword/value DSN into its settings, as libpq and pgx
// read it: keyword, optional blanks, "=", optional blanks, and a value
// that runs to the next blank or, quoted, to the next unescaped quote; a
// backslash escapes the next character. ok is false for anything else;
// settings then holds those read before the fault, and an unterminated
// quoted value runs to the end.
func parseDSN(s string) (settings []setting, ok bool) {
	const blanks = " \t\n\r\v\f"
	i := len(s) - len(strings.TrimLeft(s, blanks))
	for i < len(s) {
		eq := strings.IndexByte(s[i:], '=')
		if eq < 0 {
			return settings, false
		}
		key := strings.TrimRight(s[i:i+eq], blanks)
		if !dsnKeyword.MatchString(key) {
			return settings, false
		}
		start := i + eq + 1
		start += len(s[start:]) - len(strings.TrimLeft(s[start:], blanks))
		end := start
		if end < len(s) && s[end] == '\'' {
			for end++; end < len(s) && s[end] != '\''; end++ {
				if s[end] == '\\' {
					end++
				}
			}
			if end >= len(s) {
				return append(settings, setting{key: key, value: s[start:], at: start}), false
			}
			end++
		} else {
			for ; end < len(s) && !strings.ContainsRune(blanks, rune(s[end])); end++ {
				if s[end] == '\\' {
					end++
				}
			}
			end = min(end, len(s))
		}
		settings = append(settings, setting{key: key, value: s[start:end], at: start})
		i = end + len(s[end:]) - len(strings.TrimLeft(s[end:], blanks))
	}
	return settings, len(settings) > 0
}

// redactDSN is [URL] for a keyword/value DSN; ok is false if s is not one.
func redactDSN(s string) (shown string, ok bool) {
	settings, ok := parseDSN(s)
	if !ok {
		return "", false
	}
	var b strings.Builder
	last := 0
	for _, st := range settings {
		if secretKey(st.key) && st.value != "" {
			b.WriteString(s[last:st.at])
			b.WriteString(Mask)
			last = st.at + len(st.value)
		}
	}
	b.WriteString(s[last:])
	return b.String(), true
}

// unquote is a DSN value as libpq and pgx take it: without its quotes
// and backslashes.
func unquote(v string) string {
	if strings.HasPrefix(v, "'") {
		v = strings.TrimSuffix(v[1:], "'")
	}
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] == '\\' {
			i++
			if i == len(v) {
				break
			}
		}
		b.WriteByte(v[i])
	}
	return b.String()
}

// passwords returns a replacer that masks every password of raw (a URL,
// a list of them or a keyword/value DSN), in each of the forms a library
// might quote it in.
func passwords(raw string) *strings.Replacer {
	var forms []string
	add := func(s string) {
		if s != "" && !slices.Contains(forms, s) {
			forms = append(forms, s)
		}
	}
	// addDecoded adds a password as a library has it, and escaped in
	// each of the ways a library might re-escape it.
	addDecoded := func(pw string) {
		add(pw)
		add(url.QueryEscape(pw))
		add(url.PathEscape(pw))
		add(strings.TrimPrefix(url.UserPassword("", pw).String(), ":")) // escaped as user information
	}
	for _, e := range split(raw) {
		if !schemeStart.MatchString(e) {
			// A keyword/value DSN, complete or not: what it holds up to
			// where it cannot be read.
			settings, _ := parseDSN(e)
			for _, st := range settings {
				if secretKey(st.key) {
					add(st.value)
					add(strings.TrimSuffix(strings.TrimPrefix(st.value, "'"), "'"))
					addDecoded(unquote(st.value))
				}
			}
			continue
		}
		// The user information's password: as pgx cuts it, and as net/url
		// does, or would where the URL does not parse (it may still be
		// quoted), taken as written and decoded.
		written := []string{pgxPassword(e)}
		u, err := url.Parse(e)
		if err != nil || u.User != nil {
			written = append(written, writtenPassword(e))
		}
		for _, w := range written {
			add(w)
			addDecoded(percentDecode(w))
		}
		if err == nil && u.User != nil {
			if pw, ok := u.User.Password(); ok {
				addDecoded(pw)
			}
		}
		// The password parameters, their values as written and decoded,
		// "+" kept (pgx) or read as a blank (net/url).
		if i := strings.IndexAny(e, "?#"); i >= 0 {
			for _, pair := range strings.Split(e[i+1:], "&") {
				if _, value, ok := secretParam(pair); ok {
					add(value)
					addDecoded(percentDecode(value))
					if pw, err := url.QueryUnescape(value); err == nil {
						addDecoded(pw)
					}
				}
			}
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

// pgxPassword returns the password of a URL as pgx and libpq find it,
// between the first colon and the first "@" before any "/", or "".
func pgxPassword(elem string) string {
	_, rest, ok := strings.Cut(elem, "://")
	if !ok {
		return ""
	}
	at := strings.IndexAny(rest, "@/")
	if at < 0 || rest[at] != '@' {
		return ""
	}
	_, pw, _ := strings.Cut(rest[:at], ":")
	return pw
}
