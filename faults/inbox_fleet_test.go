//go:build faults

package faults

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// buildInboxConsumer builds faults/inboxconsumer, once for the scenario,
// without the race detector, as the relay is.
func buildInboxConsumer(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "inboxconsumer")
	out, err := exec.Command("go", "build", "-o", bin, "./inboxconsumer").CombinedOutput()
	require.NoError(t, err, "build inboxconsumer: %s", out)
	return bin
}

// inboxQueue declares the scenario's durable queue, bound to every routing
// key of exchange, whose rejected deliveries go through a dead-letter
// exchange of their own to the dead-letter queue dlq. All three are
// deleted when the test ends.
func inboxQueue(t *testing.T, exchange string) (queue, dlq string) {
	t.Helper()
	queue, dlq, dlx := testkit.UniqueName("outboxrelay_inbox"), testkit.UniqueName("outboxrelay_inbox_dead"), testkit.UniqueName("outboxrelay_inbox_dlx")
	conn, err := amqp.Dial(testkit.AMQPURL())
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() {
		conn, err := amqp.Dial(testkit.AMQPURL())
		if err != nil {
			t.Errorf("delete the inbox queues: %v", err)
			return
		}
		defer conn.Close()
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
			_, _ = ch.QueueDelete(dlq, false, false, false)
			_ = ch.ExchangeDelete(dlx, false, false)
		}
	})
	require.NoError(t, ch.ExchangeDeclare(dlx, amqp.ExchangeFanout, true, false, false, false, nil))
	_, err = ch.QueueDeclare(dlq, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(dlq, "", dlx, false, nil))
	_, err = ch.QueueDeclare(queue, true, false, false, false, amqp.Table{"x-dead-letter-exchange": dlx})
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(queue, "#", exchange, false, nil))
	return queue, dlq
}

// queueReady is how many messages wait in queue, not counting those
// delivered and not yet acked.
func queueReady(t *testing.T, queue string) int {
	t.Helper()
	conn, err := amqp.Dial(testkit.AMQPURL())
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err)
	return q.Messages
}

// queueMessages is how many messages queue holds, ready or delivered and
// not yet acked, as rabbitmqctl counts them (AMQP tells only the ready).
func queueMessages(t *testing.T, queue string) int {
	t.Helper()
	for _, line := range strings.Split(rabbitmqctl(t, "list_queues", "-q", "--no-table-headers", "name", "messages"), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == queue {
			var n int
			_, err := fmt.Sscan(f[1], &n)
			require.NoError(t, err, line)
			return n
		}
	}
	t.Fatalf("rabbitmqctl list_queues: no queue %s", queue)
	return 0
}

// ledgerRows is how many events the ledger holds.
func ledgerRows(t *testing.T, w *world) int {
	t.Helper()
	return int(testkit.QueryInt(t, w.pool, `SELECT count(*) FROM ledger`))
}

// inboxFaultKind is what one step of the plan does.
type inboxFaultKind int

const (
	inboxKill      inboxFaultKind = iota // SIGKILL a consumer, start a new one in its place
	inboxCut                             // cut a consumer's AMQP connection, refuse new ones
	inboxRestore                         // accept a consumer's AMQP connections again
	inboxTerminate                       // terminate every PostgreSQL backend of the consumers
)

// inboxFault is one step of the plan: at, from the start of the drain, a
// fault of kind strikes consumer copy target (if it is about one).
type inboxFault struct {
	at     time.Duration
	kind   inboxFaultKind
	target int
}

// inboxPlan is every fault of the scenario, in time order.
type inboxPlan []inboxFault

// drawInboxPlan draws the faults of the first horizon of the drain: a
// consumer killed every 1 to 3 s; a consumer's AMQP connection cut every
// 0.3 to 1.2 s, for 20 to 250 ms (a cut is over before the next one); the
// consumers' backends terminated every 1 to 3 s. The plan depends on the
// seed alone, not on how fast the drain goes.
func drawInboxPlan(r *rand.Rand, horizon time.Duration) inboxPlan {
	var plan inboxPlan
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(r.Int64N(int64(hi-lo))) }
	for at := between(time.Second, 3*time.Second); at < horizon; at += between(time.Second, 3*time.Second) {
		plan = append(plan, inboxFault{at: at, kind: inboxKill, target: r.IntN(inboxCopies)})
	}
	for at := between(300*time.Millisecond, 1200*time.Millisecond); at < horizon; at += between(300*time.Millisecond, 1200*time.Millisecond) {
		c := r.IntN(inboxCopies)
		plan = append(plan, inboxFault{at: at, kind: inboxCut, target: c},
			inboxFault{at: at + between(20*time.Millisecond, 250*time.Millisecond), kind: inboxRestore, target: c})
	}
	for at := between(time.Second, 3*time.Second); at < horizon; at += between(time.Second, 3*time.Second) {
		plan = append(plan, inboxFault{at: at, kind: inboxTerminate})
	}
	slices.SortStableFunc(plan, func(a, b inboxFault) int { return cmp.Compare(a.at, b.at) })
	return plan
}

func (p inboxPlan) String() string {
	var n [4]int
	for _, f := range p {
		n[f.kind]++
	}
	return fmt.Sprintf("%d consumer kills, %d AMQP cuts, %d backend terminations over %s at most",
		n[inboxKill], n[inboxCut], n[inboxTerminate], p[len(p)-1].at.Round(time.Second))
}

// inboxFaults counts the faults that struck.
type inboxFaults struct{ kills, cuts, terminations, relayKills int }

func (f inboxFaults) total() int { return f.kills + f.cuts + f.terminations + f.relayKills }

// inboxFleet is the three consumer processes, each reaching RabbitMQ
// through a proxy of its own (which stays when the process is replaced),
// and PostgreSQL directly, as application_name inboxledger-<copy>.
type inboxFleet struct {
	t       *testing.T
	bin     string
	envs    [][]string
	proxies []*cuttableProxy
	procs   []*testkit.Process
	addrs   []string
	// all is every consumer process started, killed ones included.
	all []*testkit.Process
	// relay is the relay that runs now, watched with the consumers.
	relay *testkit.Process
	// gone sums the last scrape of every process killed: taken just before
	// its SIGKILL, it misses what the process counted in between.
	gone inboxCounts
}

// cuttableProxy is a proxy that knows whether it is cut.
type cuttableProxy struct {
	*testkit.Proxy
	cut bool
}

func (p *cuttableProxy) Cut()     { p.Proxy.Cut(); p.cut = true }
func (p *cuttableProxy) Restore() { p.Proxy.Restore(); p.cut = false }

// inboxCounts are a consumer's inbox metrics.
type inboxCounts struct{ processed, duplicates, retried, dbFailures, dead float64 }

func (c *inboxCounts) add(o inboxCounts) {
	c.processed += o.processed
	c.duplicates += o.duplicates
	c.retried += o.retried
	c.dbFailures += o.dbFailures
	c.dead += o.dead
}

func newInboxFleet(t *testing.T, bin, databaseURL, queue string) *inboxFleet {
	t.Helper()
	f := &inboxFleet{t: t, bin: bin}
	for i := range inboxCopies {
		proxy, amqpURL := testkit.NewAMQPProxy(t)
		f.proxies = append(f.proxies, &cuttableProxy{Proxy: proxy})
		f.envs = append(f.envs, []string{
			"DATABASE_URL=" + testkit.WithParam(databaseURL, fmt.Sprintf("application_name=%s%d", inboxAppName, i)),
			"AMQP_URL=" + amqpURL,
			"QUEUE=" + queue,
			"NAME=" + inboxName,
		})
		f.procs = append(f.procs, nil)
		f.addrs = append(f.addrs, "")
		f.start(i)
	}
	return f
}

// start starts consumer copy i and waits until it serves its metrics.
func (f *inboxFleet) start(i int) {
	f.t.Helper()
	p := testkit.StartProcess(f.t, f.bin, f.envs[i])
	var addr string
	p.AwaitOutput(30*time.Second, "the inbox consumer to start", func(out string) bool {
		for _, line := range strings.Split(out, "\n") {
			var rec struct{ Msg, Addr string }
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "inbox consumer started" {
				addr = rec.Addr
				return true
			}
		}
		return false
	})
	f.procs[i], f.addrs[i] = p, addr
	f.all = append(f.all, p)
}

// kill SIGKILLs consumer copy i, after scraping its counts, and starts
// another in its place.
func (f *inboxFleet) kill(i int) {
	f.t.Helper()
	counts := f.scrape(i)
	f.procs[i].Kill()
	f.gone.add(counts)
	f.start(i)
}

// scrape reads consumer copy i's inbox metrics.
func (f *inboxFleet) scrape(i int) inboxCounts {
	f.t.Helper()
	m := testkit.Scrape(f.t, f.addrs[i])
	c := inboxCounts{
		processed:  m.Value("inbox_processed_total", "consumer", inboxName),
		duplicates: m.Value("inbox_duplicates_total", "consumer", inboxName),
		retried:    m.Value("inbox_retried_total", "consumer", inboxName),
		dbFailures: m.Value("inbox_database_failures_total", "consumer", inboxName),
	}
	for k, v := range m {
		if strings.HasPrefix(k, "inbox_dead_lettered_total{") {
			c.dead += v
		}
	}
	return c
}

// checkRunning fails the test if a consumer or the relay exited that was
// not killed.
func (f *inboxFleet) checkRunning() {
	f.t.Helper()
	for i, p := range f.procs {
		select {
		case <-p.Done():
			f.t.Fatalf("inbox consumer %d exited (%v):\n%s", i, p.Err(), p.Out.String())
		default:
		}
	}
	if f.relay != nil {
		select {
		case <-f.relay.Done():
			f.t.Fatalf("the relay exited (%v):\n%s", f.relay.Err(), f.relay.Out.String())
		default:
		}
	}
}

// logSummary counts the warnings and errors every consumer process
// logged, by level and message, most frequent first.
func (f *inboxFleet) logSummary() string {
	counts := map[string]int{}
	for _, p := range f.all {
		for _, line := range strings.Split(p.Out.String(), "\n") {
			var rec struct{ Level, Msg string }
			if json.Unmarshal([]byte(line), &rec) == nil && (rec.Level == "WARN" || rec.Level == "ERROR") {
				counts[rec.Level+" "+rec.Msg]++
			}
		}
	}
	keys := slices.Collect(maps.Keys(counts))
	slices.SortFunc(keys, func(a, b string) int { return cmp.Or(cmp.Compare(counts[b], counts[a]), cmp.Compare(a, b)) })
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\n\t%6d  %s", counts[k], k)
	}
	return cmp.Or(b.String(), "none")
}

// await waits until cond holds, failing the test after timeout or as
// soon as a consumer exits.
func (f *inboxFleet) await(timeout time.Duration, what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		f.checkRunning()
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%s: not within %s", what, timeout)
		}
		<-tick.C
	}
}

// stop scrapes every running consumer, stops it with SIGTERM (it must
// exit cleanly) and returns the counts of every process the scenario ran.
func (f *inboxFleet) stop() inboxCounts {
	f.t.Helper()
	total := f.gone
	for i, p := range f.procs {
		total.add(f.scrape(i))
		p.Stop(time.Minute)
		require.NotContains(f.t, strings.ToLower(p.Out.String()), "panic")
	}
	return total
}
