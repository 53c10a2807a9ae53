package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of utime and stime in /proc/<pid>/stat: USER_HZ,
// 100 on Linux.
const clockTick = 10 * time.Millisecond

// procStat is what /proc/<pid>/stat tells of a process.
type procStat struct {
	comm string
	cpu  time.Duration // utime + stime
}

// readProcStat reads /proc/<pid>/stat.
func readProcStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, fmt.Errorf("read stat of %d: %w", pid, err)
	}
	// pid (comm) state ppid …: comm may hold spaces and parentheses, so
	// split at the last ")".
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return procStat{}, fmt.Errorf("read stat of %d: malformed", pid)
	}
	fields := strings.Fields(string(b[end+1:]))
	// fields[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(fields) < 13 {
		return procStat{}, fmt.Errorf("read stat of %d: %d fields", pid, len(fields)+2)
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return procStat{}, fmt.Errorf("read stat of %d: %w", pid, err)
	}
	return procStat{comm: string(b[open+1 : end]), cpu: time.Duration(utime+stime) * clockTick}, nil
}

// readPeakRSS reads a process's peak resident set size (VmHWM) in bytes
// from /proc/<pid>/status.
func readPeakRSS(pid int) (int64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("read status of %d: %w", pid, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("read VmHWM of %d: %w", pid, err)
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read status of %d: %w", pid, err)
	}
	return 0, fmt.Errorf("read status of %d: no VmHWM", pid)
}
