package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/alecthomas/kong"
)

// Exit codes.
const (
	ExitOK      = 0
	ExitFailure = 1
	// ExitUsage is for bad configuration or usage, and for a service that
	// cannot be reached at start-up.
	ExitUsage = 2
)

// UsageError is a configuration problem or a service unreachable at
// start-up: exit code 2.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// Usage marks err as a usage error.
func Usage(err error) error { return UsageError{Err: err} }

// Usagef formats a usage error.
func Usagef(format string, args ...any) error { return Usage(fmt.Errorf(format, args...)) }

// Parse parses args into grammar, a kong grammar (a pointer to a struct of
// commands and flags), for the command name, and returns the selected
// command ("" when there is none). Help is compact and written to stdout,
// after which exit is called. A bad command line is a UsageError.
func Parse(name, description string, grammar any, args []string, stdout, stderr io.Writer, exit func(int)) (string, error) {
	parser, err := kong.New(grammar,
		kong.Name(name),
		kong.Description(description),
		kong.Writers(stdout, stderr),
		kong.Exit(exit),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
	)
	if err != nil {
		return "", err
	}
	kctx, err := parser.Parse(args)
	if err != nil {
		return "", Usage(err)
	}
	return kctx.Command(), nil
}

// ExitCode reports err, if any, on stderr as "name: message", the message
// on one line, and returns the exit code for it: ExitOK for nil,
// ExitUsage for a UsageError, ExitFailure otherwise.
func ExitCode(name string, err error, stderr io.Writer) int {
	if err == nil {
		return ExitOK
	}
	fmt.Fprintf(stderr, "%s: %s\n", name, OneLine(err.Error()))
	if errors.As(err, new(UsageError)) {
		return ExitUsage
	}
	return ExitFailure
}

// OneLine folds a multi-line error (pgx lists every host it tried on a line
// of its own) into one line.
func OneLine(s string) string {
	lines := strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' })
	for i, l := range lines {
		lines[i] = strings.TrimSpace(l)
	}
	return strings.Join(lines, " ")
}
