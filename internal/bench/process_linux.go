package bench

import "syscall"

// childAttr makes a child receive SIGTERM if the benchmark dies without
// stopping it.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
