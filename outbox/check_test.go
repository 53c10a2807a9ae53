package outbox_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// The library's tests use the standard library only (and pgx and the
// OpenTelemetry API): an assertion module in the library's go.mod would be
// in every application's module graph. These are the few checks they need.

// must fails the test at once when err is not nil; what names the step.
func must(t testing.TB, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// equal fails the test at once unless got and want are deeply equal.
func equal[T any](t testing.TB, what string, got, want T) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s:\n got %s\nwant %s", what, show(got), show(want))
	}
}

// refused fails the test at once unless err wraps target and its text
// contains text.
func refused(t testing.TB, what string, err, target error, text string) {
	t.Helper()
	switch {
	case err == nil:
		t.Fatalf("%s: no error, want one wrapping %q and containing %q", what, target, text)
	case !errors.Is(err, target):
		t.Fatalf("%s: %q does not wrap %q", what, err, target)
	case !strings.Contains(err.Error(), text):
		t.Fatalf("%s: %q does not contain %q", what, err, text)
	}
}

// show is v as JSON where it has one (pointers followed, maps sorted), or
// as Go syntax.
func show(v any) string {
	if b, err := json.Marshal(v); err == nil {
		return string(b)
	}
	return fmt.Sprintf("%#v", v)
}
