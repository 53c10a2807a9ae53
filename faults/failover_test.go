//go:build faults

package faults

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/outboxrelay/internal/testkit"
	"github.com/outboxrelay/outboxrelay/notify"
)

// pgPair is a primary and its synchronous standby: two more clusters of
// the installed PostgreSQL server, made with pg_createcluster and
// pg_basebackup beside the shared cluster, which they do not touch. Each
// has its own name, port and data directory, and trusts local connections.
// Which of the two is the primary changes with a failover.
type pgPair struct {
	t       *testing.T
	version string
}

// pairNames and pairPorts are the two clusters'; the suite runs one
// scenario at a time, so fixed names and ports do not collide.
var (
	pairNames = [2]string{"outboxrelay_faults_a", "outboxrelay_faults_b"}
	pairPorts = [2]int{5794, 5795}
)

// newPGPair makes cluster 0 a primary and cluster 1 its synchronous
// standby, streaming; the test's end drops both, whether it passed or not
// (and so does the next run, should this one be killed before its end).
func newPGPair(t *testing.T) *pgPair {
	t.Helper()
	versions, err := os.ReadDir("/etc/postgresql")
	if err != nil || len(versions) == 0 {
		t.Fatalf("PostgreSQL failover needs the clusters of pg_createcluster: %v", err)
	}
	p := &pgPair{t: t, version: versions[0].Name()}
	p.drop()
	t.Cleanup(p.drop)
	for i := range pairNames {
		p.run("pg_createcluster", "-p", fmt.Sprint(pairPorts[i]), p.version, pairNames[i], "--", "--auth=trust")
	}
	p.ctl(0, "start")
	p.backup(1, 0)
	p.ctl(1, "start")
	// Synchronous from now on: a commit returns once the standby has it.
	p.exec(0, "ALTER SYSTEM SET synchronous_standby_names = '*'")
	p.exec(0, "SELECT pg_reload_conf()")
	testkit.WaitFor(t, time.Minute, "the standby to replicate synchronously", func() bool {
		return p.query(0, "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'") == 1
	})
	return p
}

// drop stops and removes both clusters, if they exist.
func (p *pgPair) drop() {
	for _, name := range pairNames {
		if _, err := os.Stat(filepath.Join("/etc/postgresql", p.version, name)); err != nil {
			continue
		}
		if out, err := exec.Command("pg_dropcluster", "--stop", p.version, name).CombinedOutput(); err != nil {
			p.t.Errorf("PostgreSQL pair: drop %s: %v: %s", name, err, out)
		}
	}
}

// run runs a command and fails the test if it fails.
func (p *pgPair) run(name string, args ...string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, name, args...).CombinedOutput(); err != nil {
		p.t.Fatalf("PostgreSQL pair: %s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

// ctl runs pg_ctlcluster's action on cluster i, with pg_ctlcluster's
// options before it (-m immediate).
func (p *pgPair) ctl(i int, action string, opts ...string) {
	p.t.Helper()
	args := append(append([]string{"--skip-systemctl-redirect"}, opts...), p.version, pairNames[i], action)
	p.run("pg_ctlcluster", args...)
}

// backup replaces cluster i's data with a base backup of cluster from,
// configured as its standby (-R).
func (p *pgPair) backup(i, from int) {
	p.t.Helper()
	dir := filepath.Join("/var/lib/postgresql", p.version, pairNames[i])
	entries, err := os.ReadDir(dir) // emptied, not removed: its parent is root's
	if err != nil {
		p.t.Fatal(err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			p.t.Fatal(err)
		}
	}
	p.run("runuser", "-u", "postgres", "--", "pg_basebackup", "-h", "127.0.0.1", "-p", fmt.Sprint(pairPorts[from]),
		"-U", "postgres", "-D", dir, "-R", "-X", "stream", "-c", "fast")
}

// url is the multi-host URL of database db on both clusters, the first
// cluster first.
func (p *pgPair) url(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s", pairPorts[0], pairPorts[1], db)
}

// conn connects to cluster i alone, to its database postgres.
func (p *pgPair) conn(i int) *pgx.Conn {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres", pairPorts[i]))
	if err != nil {
		p.t.Fatalf("PostgreSQL pair: connect to %s: %v", pairNames[i], err)
	}
	return conn
}

// exec runs sql on cluster i.
func (p *pgPair) exec(i int, sql string) {
	p.t.Helper()
	conn := p.conn(i)
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		p.t.Fatalf("PostgreSQL pair: %s on %s: %v", sql, pairNames[i], err)
	}
}

// query is the number sql returns on cluster i.
func (p *pgPair) query(i int, sql string) int {
	p.t.Helper()
	conn := p.conn(i)
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), sql).Scan(&n); err != nil {
		p.t.Fatalf("PostgreSQL pair: %s on %s: %v", sql, pairNames[i], err)
	}
	return n
}

// relaySessions is how many sessions of the relay cluster i holds.
func (p *pgPair) relaySessions(i int) int {
	return p.query(i, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'outboxrelay%'")
}

// awaitListener waits until the relay's listener has a session on
// cluster i, the primary: LISTEN is refused on a standby, so a listener
// that followed the failover is there.
func (p *pgPair) awaitListener(i int) {
	p.t.Helper()
	testkit.WaitFor(p.t, time.Minute, "the relay's listener on "+pairNames[i], func() bool {
		return p.query(i, "SELECT count(*) FROM pg_stat_activity WHERE application_name = '"+notify.ApplicationName+"'") == 1
	})
}

// Scenario 13: a PostgreSQL primary and its synchronous standby, which
// the relay and the producers both reach through one multi-host URL
// (host=primary,standby); the relay's is given without
// target_session_attrs, since it adds read-write itself.
//
//   - No primary: the relay starts while the primary is stopped and only
//     the standby answers. It must wait, and relay once the primary is
//     back.
//   - Failover: mid-stream, the primary is killed (immediate shutdown, a
//     crash to the standby) and the standby promoted. Producers retry
//     until the promoted server takes their inserts. Every event committed
//     before and after must arrive: synchronous replication puts each
//     committed one on the standby. Duplicates are counted (claims and
//     marks that did not reach the standby are made again), and recovery
//     is measured from the promotion.
//   - The old primary comes back as a standby of the new one, first in
//     the URL. The relay's sessions are terminated so that it dials again:
//     it must skip the standby for the primary, and the events that follow
//     arrive.
func TestPostgresFailover(t *testing.T) {
	pg := newPGPair(t)
	const db = "outboxrelay_failover"
	pg.exec(0, "CREATE DATABASE "+db)
	url := pg.url(db) + "?target_session_attrs=read-write" // the producers' and the suite's
	testkit.Migrate(t, url)
	exchange := testkit.NewExchange(t)
	w := worldOn(t, url, testkit.NewPool(t, url), exchange, newCounter(t, exchange))
	o := outcome{Scenario: "13 PostgreSQL primary killed, its synchronous standby promoted"}

	pg.ctl(0, "stop")
	p := w.relayThrough(pg.url(db), testkit.AMQPURL(), crashArgs...)
	testkit.WaitFor(t, time.Minute, "the relay to wait for a primary", func() bool {
		return strings.Contains(p.Out.String(), "waiting for a primary")
	})
	pg.ctl(0, "start")
	w.insert("no-primary", 100)
	w.settle(&o, "no-primary", 100, w.ended("no-primary"))
	t.Logf("no-primary: the relay waited while only the standby answered, and relayed once the primary was back")

	const events = 30000
	tag := "failover"
	wait := w.stream(tag, events)
	w.waitPublished(tag, 2000+rng(t).IntN(8000), time.Minute)
	killed := time.Now()
	pg.ctl(0, "stop", "-m", "immediate")
	pg.ctl(1, "promote")
	end := w.ended(tag)
	o.Faults++
	t.Logf("%s: primary killed after %d events committed; the standby was promoted %s later", tag,
		end.committed, end.at.Sub(killed).Round(time.Millisecond))
	wait()
	w.settle(&o, tag, events, end)
	pg.awaitListener(1)

	pg.backup(0, 1)
	pg.ctl(0, "start")
	terminated := pg.query(1, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name LIKE 'outboxrelay%'")
	const after = 2000
	w.insert("old-primary-back", after)
	back := w.ended("old-primary-back")
	o.Faults++
	w.settle(&o, "old-primary-back", after, back)
	pg.awaitListener(1)
	if n := pg.relaySessions(0); n != 0 {
		t.Errorf("the relay holds %d sessions on the old primary, now a standby", n)
	}
	t.Logf("old-primary-back: the old primary rejoined as a standby; %d relay sessions terminated, and the relay dialled the new primary again", terminated)
	p.Stop(time.Minute)
	if strings.Contains(strings.ToLower(p.Out.String()), "panic") {
		t.Errorf("the relay panicked:\n%s", p.Out)
	}
	o.Notes = append(o.Notes, fmt.Sprintf("13: the standby was promoted %s after the primary was killed; recovery runs from the promotion",
		end.at.Sub(killed).Round(time.Millisecond)))
	record(o)
	if o.Lost != 0 {
		t.Fatalf("%d events lost", o.Lost)
	}
}
