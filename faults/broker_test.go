//go:build faults

package faults

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/testkit"
)

// outage is how long the broker stays unreachable in scenario 4.
const outage = 10 * time.Second

// brokerRuns is how many times each broker outage is played.
const brokerRuns = 2

// brokerOutage streams 30,000 events at 5,000/s through a proxy to RabbitMQ
// and, at a random point, breaks the proxy for 10 s with fault, then
// repairs it with repair; every event must arrive.
func brokerOutage(t *testing.T, scenario, name string, fault func(*testkit.Proxy), repair func(*testkit.Proxy)) {
	w := newWorld(t)
	r := rng(t)
	o := outcome{Scenario: scenario}
	const events = 30000
	for run := range brokerRuns {
		tag := fmt.Sprintf("%s-%d", name, run)
		proxy, amqpURL := testkit.NewAMQPProxy(t)
		p := w.relayVia(amqpURL, crashArgs...)
		wait := w.stream(tag, events)
		w.count.waitDistinct(t, tag, 1000+r.IntN(5000), time.Minute)
		fault(proxy)
		<-time.After(outage) // the fault's duration
		repair(proxy)
		repaired := time.Now()
		wait()
		w.settle(&o, tag, events, repaired)
		p.Stop(time.Minute)
	}
	record(o)
	require.Zero(t, o.Lost)
}

// Scenario 4a: RabbitMQ refuses connections for 10 s; the relay waits,
// reconnects and catches up.
func TestBrokerUnreachable(t *testing.T) {
	brokerOutage(t, "4a RabbitMQ unreachable for 10 s (refused)", "refused",
		(*testkit.Proxy).Cut, (*testkit.Proxy).Restore)
}

// Scenario 4b: a silent partition: the proxy stops forwarding without
// closing anything for 10 s, so only the relay's timeouts and heartbeats
// can notice; then it forwards again.
func TestBrokerSilentPartition(t *testing.T) {
	brokerOutage(t, "4b RabbitMQ behind a silent partition for 10 s", "partition",
		(*testkit.Proxy).Blackhole, (*testkit.Proxy).Heal)
}

// Scenario 7: every byte to and from RabbitMQ is delayed by 200 ms while
// 20,000 events stream in: throughput degrades, nothing is lost.
func TestSlowBroker(t *testing.T) {
	w := newWorld(t)
	o := outcome{Scenario: "7 RabbitMQ 200 ms away"}
	const (
		tag    = "slow"
		events = 20000
	)
	proxy, amqpURL := testkit.NewAMQPProxy(t)
	p := w.relayVia(amqpURL, crashArgs...)
	proxy.Latency(200 * time.Millisecond)
	slowed := time.Now()
	wait := w.stream(tag, events)
	wait()
	w.settle(&o, tag, events, slowed)
	p.Stop(time.Minute)
	record(o)
	require.Zero(t, o.Lost)
}
