package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The relay adds schedtrace to GODEBUG and keeps the rest of the
// environment; a schedtrace already there (the operator's, or the relay's
// own after its re-exec) leaves the environment as it is, so the relay
// re-executes at most once.
func TestSysmonEnvAddsSchedtraceOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		env     []string
		want    []string
		changed bool
	}{
		{"no GODEBUG", []string{"PATH=/bin", "A=1"}, []string{"PATH=/bin", "A=1", "GODEBUG=" + sysmonSchedtrace}, true},
		{"other settings kept", []string{"GODEBUG=madvdontneed=1", "PATH=/bin"}, []string{"PATH=/bin", "GODEBUG=madvdontneed=1," + sysmonSchedtrace}, true},
		{"the first GODEBUG is the one Go reads", []string{"GODEBUG=gctrace=0", "GODEBUG=x=1"}, []string{"GODEBUG=gctrace=0," + sysmonSchedtrace}, true},
		{"the operator's schedtrace", []string{"GODEBUG=schedtrace=0", "PATH=/bin"}, []string{"GODEBUG=schedtrace=0", "PATH=/bin"}, false},
		{"after the re-exec", []string{"PATH=/bin", "GODEBUG=" + sysmonSchedtrace}, []string{"PATH=/bin", "GODEBUG=" + sysmonSchedtrace}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, changed := sysmonEnv(tc.env)
			require.Equal(t, tc.changed, changed)
			require.Equal(t, tc.want, got)
		})
	}
}
