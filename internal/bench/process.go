package bench

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// stopTimeout is how long a stopped process may take to exit after SIGTERM
// before it is killed.
const stopTimeout = 30 * time.Second

// process is a child outboxrelay (the relay or the naive poller). Its
// output is kept, the tail of it quoted in errors.
type process struct {
	name string
	cmd  *exec.Cmd
	out  *tail
	done chan struct{}
	err  error // cmd.Wait's result, set before done closes

	stopOnce sync.Once
	stopErr  error
}

// startProcess starts exe with args and exactly the environment env.
func startProcess(name, exe string, args, env []string) (*process, error) {
	p := &process{name: name, cmd: exec.Command(exe, args...), out: &tail{max: 16 << 10}, done: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = childAttr()
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// pid is the child's process id.
func (p *process) pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *process) Done() <-chan struct{} { return p.done }

// exitError describes an exit nobody asked for; call it after Done.
func (p *process) exitError() error {
	status := "exit status 0"
	if p.err != nil {
		status = p.err.Error()
	}
	return fmt.Errorf("%s exited unexpectedly (%s): %s", p.name, status, p.out.last())
}

// stop sends SIGTERM and waits for the exit, killing the process after
// stopTimeout. An exit other than a clean one is an error. Calls after the
// first return the first one's result.
func (p *process) stop() error {
	p.stopOnce.Do(func() { p.stopErr = p.terminate() })
	return p.stopErr
}

func (p *process) terminate() error {
	select {
	case <-p.done:
		return p.exitError()
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		if errors.Is(err, os.ErrProcessDone) {
			<-p.done
			return p.exitError()
		}
		return fmt.Errorf("stop %s: %w", p.name, err)
	}
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("stop %s: still running %s after SIGTERM, killed: %s", p.name, stopTimeout, p.out.last())
	}
	if p.err != nil {
		return fmt.Errorf("stop %s: %w: %s", p.name, p.err, p.out.last())
	}
	return nil
}

// tail keeps the last max bytes written to it.
type tail struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

// last returns the last few lines, folded onto one line.
func (t *tail) last() string {
	t.mu.Lock()
	s := strings.TrimSpace(string(t.buf))
	t.mu.Unlock()
	lines := strings.Split(s, "\n")
	if len(lines) > 10 {
		lines = lines[len(lines)-10:]
	}
	if s == "" {
		return "(no output)"
	}
	return strings.Join(lines, " | ")
}

// randomHex returns 2n random hex digits.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails
	return hex.EncodeToString(b)
}
