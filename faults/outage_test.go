//go:build faults

package faults

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// outageRuns is how many times each outage is played.
const outageRuns = 2

// outageEvents is how many events stream in during one outage.
const outageEvents = 30000

// outage takes PostgreSQL or RabbitMQ away from a relay while events
// stream in, and gives it back.
type outage struct {
	scenario, name string
	// setup prepares one run: the URLs the relay reaches PostgreSQL and
	// RabbitMQ at (a proxy, or the service itself), the fault and its
	// repair.
	setup func(t *testing.T, w *world) (databaseURL, amqpURL string, fault, repair func())
	// duration is how long the fault lasts.
	duration func(r *rand.Rand) time.Duration
	// during, if set, watches the relay while the fault lasts, until
	// over; it replaces a plain wait.
	during func(t *testing.T, w *world, p *testkit.Process, tag string, over <-chan time.Time)
	// exactlyOnce requires no duplicates: the fault cuts no connection.
	exactlyOnce bool
	// args are the relay's flags; default crashArgs.
	args []string
}

// play streams 30,000 events at 5,000/s into a relay, strikes it with the
// fault at a random point, repairs it, and requires every event to arrive.
func (f outage) play(t *testing.T) {
	w := newWorld(t)
	r := rng(t)
	o := outcome{Scenario: f.scenario}
	for run := range outageRuns {
		tag := fmt.Sprintf("%s-%d", f.name, run)
		databaseURL, amqpURL, fault, repair := f.setup(t, w)
		args := f.args
		if args == nil {
			args = crashArgs
		}
		p := w.relayThrough(databaseURL, amqpURL, args...)
		wait := w.stream(tag, outageEvents)
		at := 1000 + r.IntN(5000)
		w.waitPublished(tag, at, time.Minute)
		d := f.duration(r)
		fault()
		over := time.After(d)
		if f.during != nil {
			f.during(t, w, p, tag, over)
		} else {
			<-over
		}
		repair()
		end := w.ended(tag)
		o.Faults++
		t.Logf("%s: fault after %d events published, lasted %s", tag, at, d.Round(time.Millisecond))
		wait()
		w.settle(&o, tag, outageEvents, end)
		p.Stop(time.Minute)
	}
	record(o)
	require.Zero(t, o.Lost)
	if f.exactlyOnce {
		require.Zero(t, o.Duplicated, "nothing was cut: no event may be published twice")
	}
}

// viaAMQPProxy is an outage's setup in which the relay reaches RabbitMQ
// through a proxy that fault breaks and repair mends.
func viaAMQPProxy(fault, repair func(*testkit.Proxy)) func(*testing.T, *world) (string, string, func(), func()) {
	return func(t *testing.T, w *world) (string, string, func(), func()) {
		proxy, amqpURL := testkit.NewAMQPProxy(t)
		return w.url, amqpURL, func() { fault(proxy) }, func() { repair(proxy) }
	}
}

// tenSeconds is the outage the issue asks for.
func tenSeconds(*rand.Rand) time.Duration { return 10 * time.Second }
