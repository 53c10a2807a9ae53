package cli_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/cli"
)

func TestExitCodeReportsTheErrorOnOneLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err    error
		code   int
		stderr string
	}{
		{nil, cli.ExitOK, ""},
		{errors.New("publish failed"), cli.ExitFailure, "cmd: publish failed\n"},
		{fmt.Errorf("start: %w", cli.Usagef("--batch-size %d: must be positive", -1)), cli.ExitUsage, "cmd: start: --batch-size -1: must be positive\n"},
		{cli.Usage(errors.New("hosts:\n  a: refused\r\n  b: refused")), cli.ExitUsage, "cmd: hosts: a: refused b: refused\n"},
	} {
		var stderr bytes.Buffer
		require.Equal(t, tc.code, cli.ExitCode("cmd", tc.err, &stderr), "%v", tc.err)
		require.Equal(t, tc.stderr, stderr.String())
	}
}

func TestParseReportsABadCommandLineAsUsage(t *testing.T) {
	t.Parallel()
	var grammar struct {
		Run struct {
			Count int `name:"count" default:"1"`
		} `cmd:"" default:"withargs"`
		Other struct{} `cmd:""`
	}
	var out bytes.Buffer
	cmd, err := cli.Parse("cmd", "A command.", &grammar, []string{"--count=3"}, &out, &out, func(int) {})
	require.NoError(t, err)
	require.Equal(t, "run", cmd)
	require.Equal(t, 3, grammar.Run.Count)

	_, err = cli.Parse("cmd", "A command.", &grammar, []string{"--bogus"}, &out, &out, func(int) {})
	require.ErrorAs(t, err, new(cli.UsageError))
	require.Contains(t, err.Error(), "--bogus")
}
