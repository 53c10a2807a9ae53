package main

import "strings"

// sysmonSchedtrace is the GODEBUG setting that keeps the Go runtime's
// system monitor from parking. sysmon parks whenever every P is idle, and
// the next system call wakes it again (runtime.entersyscallWakeSysmon, a
// futex wake), after which it polls every 20 µs until it parks again. A
// relay at everyday rates goes idle between events, so each event paid for
// a wake-up and a few of those polls: a third of the relay's CPU at
// 1,000 events/s (docs/decisions/0006-runtime-monitor.md). The runtime never parks sysmon while
// schedtrace is set; sysmon then sleeps up to 10 ms a round. The period,
// the largest the runtime reads (about 24.8 days of monotonic time),
// prints a scheduler line to stderr only on a machine up longer than that,
// once at start-up and then once a period.
const sysmonSchedtrace = "schedtrace=2147483647"

// sysmonEnv is env with sysmonSchedtrace added to its GODEBUG, and whether
// it changed anything: an environment whose GODEBUG already sets
// schedtrace (the operator's choice, or this process after its re-exec) is
// left as it is.
func sysmonEnv(env []string) ([]string, bool) {
	out := make([]string, 0, len(env)+1)
	debug, found := "", false
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			if !found {
				debug, found = v, true
			}
			continue
		}
		out = append(out, kv)
	}
	for _, s := range strings.Split(debug, ",") {
		if strings.HasPrefix(strings.TrimSpace(s), "schedtrace=") {
			return env, false
		}
	}
	if debug != "" {
		debug += ","
	}
	return append(out, "GODEBUG="+debug+sysmonSchedtrace), true
}
