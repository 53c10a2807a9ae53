//go:build !unix

package main

// keepSysmonAwake does nothing where the process cannot re-execute itself
// in place; GODEBUG=schedtrace=2147483647 in the environment does the same.
func keepSysmonAwake() error { return nil }
