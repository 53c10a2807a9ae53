//go:build faults

package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outboxrelay/outboxrelay/internal/redact"
	"github.com/outboxrelay/outboxrelay/internal/testkit"
)

// rabbitCluster is three more nodes of the installed rabbitmq-server,
// joined into a cluster of their own beside the shared broker, which they
// do not touch: each has its own node name, AMQP and distribution ports,
// configuration, data directory and Erlang cookie. They run as the test's
// user, from the server's own scripts (the Debian wrapper would switch to
// the rabbitmq user and its environment).
type rabbitCluster struct {
	t     *testing.T
	nodes []rabbitNode
}

type rabbitNode struct {
	name string // Erlang node name
	port int    // AMQP port; the distribution port is port + 20000
	dir  string // HOME (the cookie), configuration, data and logs
}

// clusterPorts are the nodes' AMQP ports; the suite runs one scenario at a
// time, so fixed ports do not collide with each other.
var clusterPorts = []int{5791, 5792, 5793}

const rabbitBin = "/usr/lib/rabbitmq/bin/"

// newRabbitCluster starts the three nodes, joins the second and third to
// the first and waits until the cluster runs; the test's end stops every
// node and removes their files, whether it passed or not.
func newRabbitCluster(t *testing.T) *rabbitCluster {
	t.Helper()
	for _, p := range clusterPorts {
		for _, port := range []int{p, p + 20000} {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				t.Fatalf("RabbitMQ cluster: port %d is taken: %v", port, err)
			}
			l.Close()
		}
	}
	base, err := os.MkdirTemp("", "outboxrelay-faults-cluster")
	if err != nil {
		t.Fatal(err)
	}
	c := &rabbitCluster{t: t}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			// With its pid file, stop waits until the node's process is gone.
			if out, err := c.ctlErr(n, "stop", filepath.Join(n.dir, "pid")); err != nil {
				t.Logf("RabbitMQ cluster: stop %s: %v: %s", n.name, err, out)
			}
		}
		// Whatever did not stop (a node still booting, one that does not
		// answer) is killed: every process whose HOME is a node's.
		killUnder(t, base)
		os.RemoveAll(base)
	})
	for i, port := range clusterPorts {
		n := rabbitNode{name: fmt.Sprintf("outboxrelay-faults-%d@localhost", i+1), port: port, dir: filepath.Join(base, fmt.Sprint(i+1))}
		for _, f := range []struct{ name, text string }{
			{".erlang.cookie", "OUTBOXRELAYFAULTSCLUSTER"},
			{"rabbitmq.conf", fmt.Sprintf("listeners.tcp.local = 127.0.0.1:%d\n", port)},
			{"enabled_plugins", "[].\n"},
			{"rabbitmq-env.conf", ""},
		} {
			if err := os.MkdirAll(n.dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(n.dir, f.name), []byte(f.text), 0o400); err != nil {
				t.Fatal(err)
			}
		}
		c.nodes = append(c.nodes, n)
		cmd := exec.Command(rabbitBin+"rabbitmq-server", "-detached")
		cmd.Env, cmd.Dir = c.env(n), n.dir // an erl_crash.dump lands there
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("RabbitMQ cluster: start %s: %v: %s", n.name, err, out)
		}
	}
	for _, n := range c.nodes {
		c.awaitStartup(n)
	}
	for _, n := range c.nodes[1:] {
		c.ctl(n, "stop_app")
		c.ctl(n, "join_cluster", c.nodes[0].name)
		c.ctl(n, "start_app")
		c.awaitStartup(n)
	}
	out := c.ctl(c.nodes[0], "cluster_status", "--formatter", "json")
	for _, n := range c.nodes {
		if !strings.Contains(out, n.name) {
			t.Fatalf("RabbitMQ cluster: %s did not join: %s", n.name, out)
		}
	}
	return c
}

// awaitStartup waits until node n runs RabbitMQ. await_startup fails at
// once while the Erlang node has not registered yet, so it is retried.
func (c *rabbitCluster) awaitStartup(n rabbitNode) {
	c.t.Helper()
	testkit.WaitFor(c.t, 2*time.Minute, n.name+" to start", func() bool {
		_, err := c.ctlErr(n, "await_startup", "--timeout", "60")
		return err == nil
	})
}

// killUnder kills every process whose HOME lies under dir, and waits for
// them to go.
func killUnder(t *testing.T, dir string) {
	t.Helper()
	find := func() []int {
		var pids []int
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
			if err != nil {
				continue
			}
			for _, kv := range strings.Split(string(env), "\x00") {
				if home, ok := strings.CutPrefix(kv, "HOME="); ok && strings.HasPrefix(home, dir) {
					pids = append(pids, pid)
				}
			}
		}
		return pids
	}
	for _, pid := range find() {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		t.Logf("RabbitMQ cluster: killing process %d (%s), left running", pid, strings.TrimSpace(string(comm)))
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	testkit.WaitFor(t, 30*time.Second, "the cluster's processes to go", func() bool { return len(find()) == 0 })
}

func (c *rabbitCluster) env(n rabbitNode) []string {
	return []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + n.dir,
		"RABBITMQ_NODENAME=" + n.name,
		fmt.Sprintf("RABBITMQ_NODE_PORT=%d", n.port),
		fmt.Sprintf("RABBITMQ_DIST_PORT=%d", n.port+20000),
		"RABBITMQ_CONFIG_FILE=" + filepath.Join(n.dir, "rabbitmq.conf"),
		"RABBITMQ_CONF_ENV_FILE=" + filepath.Join(n.dir, "rabbitmq-env.conf"),
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + filepath.Join(n.dir, "enabled_plugins"),
		"RABBITMQ_MNESIA_BASE=" + filepath.Join(n.dir, "mnesia"),
		"RABBITMQ_LOG_BASE=" + filepath.Join(n.dir, "log"),
		"RABBITMQ_PID_FILE=" + filepath.Join(n.dir, "pid"),
		"ERL_EPMD_ADDRESS=127.0.0.1",
	}
}

// ctl runs rabbitmqctl against node n and fails the test if it fails.
func (c *rabbitCluster) ctl(n rabbitNode, args ...string) string {
	c.t.Helper()
	out, err := c.ctlErr(n, args...)
	if err != nil {
		c.t.Fatalf("RabbitMQ cluster: rabbitmqctl %s on %s: %v: %s", strings.Join(args, " "), n.name, err, out)
	}
	return out
}

func (c *rabbitCluster) ctlErr(n rabbitNode, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, rabbitBin+"rabbitmqctl", append([]string{"-n", n.name}, args...)...)
	cmd.Env, cmd.Dir = c.env(n), n.dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// urls is AMQP_URL for the cluster: every node, in order.
func (c *rabbitCluster) urls() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", n.port)
	}
	return out
}

// stopApp stops node i's RabbitMQ application, which closes every
// connection to it; startApp starts it again and waits until it runs.
func (c *rabbitCluster) stopApp(i int) { c.ctl(c.nodes[i], "stop_app") }

func (c *rabbitCluster) startApp(i int) {
	c.ctl(c.nodes[i], "start_app")
	c.awaitStartup(c.nodes[i])
}

// connectedNode is the node the relay's metrics say it is connected to,
// awaited for up to timeout while it is connected to none or to skip.
func (c *rabbitCluster) connectedNode(p *testkit.Process, skip int, timeout time.Duration) int {
	c.t.Helper()
	addr := testkit.HTTPAddr(c.t, p.Out)
	node := -1
	testkit.AwaitMetrics(c.t, addr, timeout, "the relay connected to a live node", func(m testkit.Metrics) bool {
		for i, u := range c.urls() {
			if i != skip && m.Value("outboxrelay_broker_connected", "url", redact.URL(u)) == 1 &&
				m.Value("outboxrelay_connection_up", "service", "rabbitmq") == 1 {
				node = i
				return true
			}
		}
		return false
	})
	return node
}

// Scenario 12: a three-node RabbitMQ cluster with a quorum queue. The relay
// is given every node (AMQP_URL, comma-separated). Mid-stream, the node it
// is connected to is stopped; once the relay has reconnected to another
// node, the stopped one is started again, and then the node the relay is
// connected to by then is stopped and started the same way. A quorum queue
// confirms a message once a majority of its replicas hold it, so with one
// node of three down every confirmed event is still on two, and the queue
// keeps accepting. Nothing may be lost; duplicates are counted (a node
// stopped mid-batch loses the confirmations it owed), and so is the time
// from the relay's "connection lost" to its "reconnected", which must stay
// within 10 s; recovery is measured from the second stop.
func TestRabbitMQClusterLosesNodes(t *testing.T) {
	c := newRabbitCluster(t)
	url, pool := testkit.NewOutbox(t)
	exchange := testkit.UniqueName("outboxrelay_faults_cluster")
	w := worldOn(t, url, pool, exchange, newCounterOn(t, exchange, broker{urls: c.urls(), quorum: true}))
	r := rng(t)
	o := outcome{Scenario: "12 RabbitMQ cluster (3 nodes, quorum queue): the relay's node stopped, twice"}
	const events = 60000
	tag := "cluster"
	p := w.relayVia(strings.Join(c.urls(), ","), crashArgs...)
	wait := w.stream(tag, events)
	node := c.connectedNode(p, -1, time.Minute)
	var (
		reconnects []time.Duration // from the relay's "connection lost" to its "reconnected"
		end        faultEnd
	)
	for stop := range 2 {
		w.waitPublished(tag, min(w.published(tag)+1000+r.IntN(4000), events), time.Minute)
		before := strings.Count(p.Out.String(), `"msg":"reconnected"`)
		c.stopApp(node)
		end = w.ended(tag)
		o.Faults++
		testkit.WaitFor(t, time.Minute, "the relay to reconnect to another node", func() bool {
			return strings.Count(p.Out.String(), `"msg":"reconnected"`) > before
		})
		lost, reconnected := logTime(t, p.Out.String(), "connection lost", before), logTime(t, p.Out.String(), "reconnected", before)
		reconnects = append(reconnects, reconnected.Sub(lost))
		next := c.connectedNode(p, node, time.Minute)
		t.Logf("%s: stop %d: node %d stopped, the relay lost its connection and was connected to node %d %s later",
			tag, stop+1, node+1, next+1, reconnected.Sub(lost).Round(time.Millisecond))
		c.startApp(node)
		node = next
	}
	wait()
	w.settle(&o, tag, events, end)
	p.Stop(time.Minute)
	o.Notes = append(o.Notes, fmt.Sprintf("from the relay's \"connection lost\" to its \"reconnected\" to another node: %s and %s",
		reconnects[0].Round(time.Millisecond), reconnects[1].Round(time.Millisecond)))
	record(o)
	if o.Lost != 0 {
		t.Fatalf("%d events lost", o.Lost)
	}
	for i, d := range reconnects {
		if d > 10*time.Second {
			t.Errorf("reconnection %d took %s: the bound is 10 s", i+1, d)
		}
	}
}

// logTime is the time of the relay's first log line with message msg after
// the first skip of them.
func logTime(t *testing.T, out, msg string, skip int) time.Time {
	t.Helper()
	for line := range strings.Lines(out) {
		if !strings.Contains(line, `"msg":"`+msg+`"`) {
			continue
		}
		if skip > 0 {
			skip--
			continue
		}
		var entry struct{ Time time.Time }
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		return entry.Time
	}
	t.Fatalf("no %q line in the relay's log", msg)
	return time.Time{}
}
