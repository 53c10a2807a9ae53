package bench

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/outboxrelay/outboxrelay/internal/redact"
)

// Machine describes where the benchmark ran.
type Machine struct {
	CPU        string `json:"cpu"`
	CPUs       int    `json:"cpus"`
	MemoryMiB  int64  `json:"memory_mib"`
	Kernel     string `json:"kernel"`
	Go         string `json:"go"`
	PostgreSQL string `json:"postgresql"`
	RabbitMQ   string `json:"rabbitmq"`
}

// Probe describes the machine and asks both services for their versions.
func Probe(ctx context.Context, cfg Config) (Machine, error) {
	cfg = cfg.withDefaults()
	m := Machine{
		CPU:    cmp.Or(procField("/proc/cpuinfo", "model name", ":"), runtime.GOARCH),
		CPUs:   runtime.NumCPU(),
		Kernel: runtime.GOOS,
		Go:     runtime.Version(),
	}
	if kb, err := strconv.ParseInt(strings.TrimSuffix(procField("/proc/meminfo", "MemTotal", ":"), " kB"), 10, 64); err == nil {
		m.MemoryMiB = kb >> 10
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = runtime.GOOS + " " + strings.TrimSpace(string(b))
	}
	connectCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	db, err := pgx.Connect(connectCtx, cfg.DatabaseURL)
	if err != nil {
		return m, fmt.Errorf("probe: PostgreSQL at %s: %w", redact.URL(cfg.DatabaseURL), redact.Error(err, cfg.DatabaseURL))
	}
	defer db.Close(context.WithoutCancel(ctx))
	if err := db.QueryRow(connectCtx, "SHOW server_version").Scan(&m.PostgreSQL); err != nil {
		return m, fmt.Errorf("probe: server_version: %w", err)
	}
	conn, err := dialAMQP(cfg.AMQPURL, "outboxrelay-bench-probe")
	if err != nil {
		return m, fmt.Errorf("probe: %w", err)
	}
	defer conn.Close()
	m.RabbitMQ = fmt.Sprint(conn.Properties["version"])
	return m, nil
}

// procField returns the value of the first "key<sep> value" line of a
// /proc file, "" if there is none.
func procField(path, key, sep string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), sep)
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
