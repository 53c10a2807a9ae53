//go:build faults

package faults

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/notify"
)

// Scenario 4a: RabbitMQ refuses connections for 10 s; the relay waits,
// reconnects and catches up.
func TestBrokerUnreachable(t *testing.T) {
	outage{
		scenario: "4a RabbitMQ unreachable for 10 s (refused)", name: "refused", duration: tenSeconds,
		setup: viaAMQPProxy((*testkit.Proxy).Cut, (*testkit.Proxy).Restore),
	}.play(t)
}

// Scenario 4b: a silent partition: the proxy stops forwarding without
// closing anything for 10 s, so only the relay's timeouts and heartbeats
// can notice; then it forwards again.
func TestBrokerSilentPartition(t *testing.T) {
	outage{
		scenario: "4b RabbitMQ behind a silent partition for 10 s", name: "partition", duration: tenSeconds,
		setup: viaAMQPProxy((*testkit.Proxy).Blackhole, (*testkit.Proxy).Heal),
	}.play(t)
}

// Scenario 4c: RabbitMQ itself is restarted (rabbitmqctl stop_app, then
// start_app 2 to 8 s later): every connection is closed by the broker, the
// port refuses while it is down, and what it had confirmed survives in the
// durable queue.
func TestBrokerRestarted(t *testing.T) {
	outage{
		scenario: "4c RabbitMQ restarted (stop_app, start_app)", name: "restart",
		duration: func(r *rand.Rand) time.Duration { return 2*time.Second + time.Duration(r.Int64N(int64(6*time.Second))) },
		setup: func(t *testing.T, w *world) (string, string, func(), func()) {
			return w.url, testkit.AMQPURL(), func() { stopRabbitMQ(t) }, func() { startRabbitMQ(t) }
		},
	}.play(t)
}

// Scenario 5: RabbitMQ's memory alarm goes off for 5 to 10 s: the broker
// blocks every publishing connection. The relay must pause (stop claiming)
// without holding a transaction open, and resume without loss once the
// alarm clears. No connection is cut, so no event may arrive twice: the
// batch in flight waits for its confirmations, holding its lease.
func TestMemoryAlarm(t *testing.T) {
	outage{
		scenario: "5 RabbitMQ memory alarm", name: "alarm",
		duration: func(r *rand.Rand) time.Duration { return 5*time.Second + time.Duration(r.Int64N(int64(5*time.Second))) },
		setup: func(t *testing.T, w *world) (string, string, func(), func()) {
			return w.url, testkit.AMQPURL(), func() { raiseMemoryAlarm(t) }, func() { clearMemoryAlarm(t) }
		},
		during:      watchBlockedRelay,
		exactlyOnce: true,
		// The default lease and confirm timeout: no relay is killed here,
		// and a broker catching up after an alarm may take more than
		// crashArgs' 1.5 s to confirm a batch.
		args: []string{"--poll-interval=500ms"},
	}.play(t)
}

// Scenario 7: at a random point of a stream of 20,000 events, every byte
// to and from RabbitMQ starts to take 200 ms more: throughput degrades,
// nothing breaks, and no lease lapses under the relay (a lapsed lease
// would show as a duplicate). Twice.
func TestSlowBroker(t *testing.T) {
	w := newWorld(t)
	r := rng(t)
	o := outcome{Scenario: "7 RabbitMQ 200 ms away"}
	const events = 20000
	for run := range 2 {
		tag := fmt.Sprintf("slow-%d", run)
		proxy, amqpURL := testkit.NewAMQPProxy(t)
		p := w.relayVia(amqpURL, crashArgs...)
		wait := w.stream(tag, events)
		w.waitPublished(tag, 500+r.IntN(5000), time.Minute)
		proxy.Latency(200 * time.Millisecond)
		o.Faults++
		wait()
		// The fault lasts; recovery is how long after the last commit the
		// slowed relay took to deliver everything.
		w.settle(&o, tag, events, w.ended(tag))
		p.Stop(time.Minute)
	}
	record(o)
	require.Zero(t, o.Lost)
	require.Zero(t, o.Duplicated, "a slow broker cut nothing: no event may be published twice")
}

// watchBlockedRelay samples the relay's PostgreSQL sessions and claims
// while the alarm lasts, after checking that its metrics and /readyz say
// it is blocked. Once the relay has logged that its connection is
// blocked, it must not claim again until the alarm clears, and at no
// sample may one of its sessions sit in an open transaction, but for the
// gate's, which holds no lock on a row (notify.GateApplicationName).
func watchBlockedRelay(t *testing.T, w *world, p *testkit.Process, tag string, over <-chan time.Time) {
	t.Helper()
	// RabbitMQ blocks a connection when it publishes during the alarm, and
	// the stream may be over by then (raising the alarm takes two
	// rabbitmqctl calls, then RabbitMQ's own memory check; the relay keeps
	// pace with the stream): probe events of another type are written, ten a
	// second, until the relay says it is blocked.
	stopProbing := w.paced(tag+"-probe", 10) // stopping twice is harmless
	defer stopProbing()
	testkit.WaitFor(t, 30*time.Second, "the relay to see its connection blocked", func() bool {
		return strings.Contains(p.Out.String(), "connection blocked by broker")
	})
	stopProbing()
	// Operators see it: the relay is not ready, and says why.
	addr := testkit.HTTPAddr(t, p.Out)
	testkit.AwaitMetrics(t, addr, 10*time.Second, "outboxrelay_broker_blocked", func(m testkit.Metrics) bool {
		return m.Value("outboxrelay_broker_blocked") == 1 && m.Value("outboxrelay_ready") == 0 &&
			m.Value("outboxrelay_connection_up", "service", "rabbitmq") == 1
	})
	require.Contains(t, testkit.AwaitStatus(t, addr, "/readyz", 503), "blocked by the broker")
	claims := func() int64 {
		return testkit.QueryInt(t, w.pool, `SELECT coalesce(sum(attempts), 0) FROM outbox WHERE event_type = $1`, tag)
	}
	before := claims()
	samples, longest := 0, time.Duration(0)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-over:
			after := claims()
			t.Logf("%s: %d samples while blocked; longest relay transaction %s; attempts %d → %d",
				tag, samples, longest, before, after)
			require.Equal(t, before, after, "the relay claimed events while its connection was blocked")
			return
		case <-tick.C:
		}
		var inTx int
		var age float64
		err := w.pool.QueryRow(context.Background(), `
			SELECT count(*) FILTER (WHERE state LIKE 'idle in transaction%'),
			       coalesce(extract(epoch FROM max(now() - xact_start)), 0)
			FROM pg_stat_activity
			WHERE datname = current_database() AND application_name LIKE 'outboxrelay%' AND pid <> pg_backend_pid()
			  AND application_name <> $1`, notify.GateApplicationName).Scan(&inTx, &age)
		require.NoError(t, err)
		samples++
		longest = max(longest, time.Duration(age*float64(time.Second)))
		require.Zero(t, inTx, "a relay session is idle in a transaction while the broker blocks it")
	}
}

// rabbitmqctl runs rabbitmqctl with args and fails the test if it fails.
func rabbitmqctl(t *testing.T, args ...string) string {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command("rabbitmqctl", args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Run(), "rabbitmqctl %s: %s", strings.Join(args, " "), out.String())
	return out.String()
}

// stopRabbitMQ stops the RabbitMQ application (the Erlang node stays up)
// and makes sure it is started again when the test ends, whatever happens.
func stopRabbitMQ(t *testing.T) {
	t.Helper()
	t.Cleanup(func() {
		if exec.Command("rabbitmq-diagnostics", "-q", "check_running").Run() != nil {
			startRabbitMQ(t)
		}
	})
	rabbitmqctl(t, "stop_app")
}

// startRabbitMQ starts the RabbitMQ application and waits until it runs.
func startRabbitMQ(t *testing.T) {
	t.Helper()
	rabbitmqctl(t, "start_app")
	rabbitmqctl(t, "await_startup")
}

// raiseMemoryAlarm sets the memory watermark so low that the alarm goes off
// at once, and makes sure the setting is restored when the test ends.
func raiseMemoryAlarm(t *testing.T) {
	t.Helper()
	watermark := strings.TrimSpace(rabbitmqctl(t, "eval", "vm_memory_monitor:get_vm_memory_high_watermark()."))
	restore := []string{"set_vm_memory_high_watermark"}
	if rest, ok := strings.CutPrefix(watermark, "{absolute,"); ok {
		restore = append(restore, "absolute", strings.TrimSuffix(strings.TrimSpace(rest), "}"))
	} else {
		restore = append(restore, watermark)
	}
	memoryRestore = restore
	t.Cleanup(func() {
		if memoryRestore != nil {
			clearMemoryAlarm(t)
		}
	})
	rabbitmqctl(t, "set_vm_memory_high_watermark", "0.000001")
}

// memoryRestore is the rabbitmqctl command that restores the watermark
// raiseMemoryAlarm changed; nil once restored.
var memoryRestore []string

// clearMemoryAlarm restores the watermark raiseMemoryAlarm changed.
func clearMemoryAlarm(t *testing.T) {
	t.Helper()
	rabbitmqctl(t, memoryRestore...)
	memoryRestore = nil
}
