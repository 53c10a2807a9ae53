//go:build unix

package main

import (
	"fmt"
	"os"
	"syscall"
)

// keepSysmonAwake re-executes the relay with sysmonSchedtrace in its
// GODEBUG, which the runtime reads only at start-up. The process keeps its
// id, arguments and the rest of its environment. It returns nil, without
// re-executing, when GODEBUG already sets schedtrace, and an error when
// the re-exec failed (the relay then runs on as it is).
func keepSysmonAwake() error {
	env, changed := sysmonEnv(os.Environ())
	if !changed {
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("sysmon: %w", err)
	}
	if err := syscall.Exec(exe, os.Args, env); err != nil {
		return fmt.Errorf("sysmon: re-exec %s: %w", exe, err)
	}
	return nil // not reached: Exec replaced the process
}
