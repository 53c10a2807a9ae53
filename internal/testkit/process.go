package testkit

import (
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// Process is a command under test running as a real process, with its
// output captured; it is killed, if still running, when the test ends.
type Process struct {
	t    testing.TB
	cmd  *exec.Cmd
	Out  *Buffer
	done chan struct{}
	err  error
}

// StartProcess starts binary with args and exactly the environment env.
func StartProcess(t testing.TB, binary string, env []string, args ...string) *Process {
	t.Helper()
	p := &Process{t: t, cmd: exec.Command(binary, args...), Out: &Buffer{}, done: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.Out, p.Out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("testkit: start %s: %v", binary, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("%s output:\n%s", binary, p.Out.String())
		}
	})
	return p
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is the process's exit error, once Done is closed.
func (p *Process) Err() error { return p.err }

// Stop sends SIGTERM and fails the test unless the process exits cleanly
// within timeout.
func (p *Process) Stop(timeout time.Duration) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatalf("testkit: SIGTERM: %v", err)
	}
	select {
	case <-p.done:
		if p.err != nil {
			p.t.Fatalf("testkit: process exited with %v:\n%s", p.err, p.Out.String())
		}
	case <-time.After(timeout):
		p.t.Fatalf("testkit: process did not stop within %s of SIGTERM:\n%s", timeout, p.Out.String())
	}
}

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Process) Kill() {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		p.t.Fatalf("testkit: SIGKILL: %v", err)
	}
	<-p.done
}

// AwaitOutput waits until cond holds for the process's output so far,
// checking every few milliseconds. It fails the test at once, with the
// output, if the process exits first, and after timeout otherwise.
func (p *Process) AwaitOutput(timeout time.Duration, what string, cond func(out string) bool) {
	p.t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond(p.Out.String()) {
		select {
		case <-p.done:
			if cond(p.Out.String()) {
				return
			}
			p.t.Fatalf("testkit: the process exited (%v) before %s:\n%s", p.err, what, p.Out.String())
		case <-deadline.C:
			p.t.Fatalf("testkit: %s: not within %s:\n%s", what, timeout, p.Out.String())
		case <-tick.C:
		}
	}
}
