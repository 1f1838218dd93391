package node

// Process-level tests: real `kedge raft serve` processes, on loopback or in lab namespaces
// behind the fault fabric, killed with SIGKILL and restarted.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/raft/api"
	"github.com/kedge-dev/kedge/internal/raft/client"
	"github.com/kedge-dev/kedge/internal/raft/config"
)

func TestMain(m *testing.M) {
	code := m.Run()
	bpftest.RemoveKedgeBinary()
	os.Exit(code)
}

type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// pcluster is a cluster of kedge processes sharing one config file.
type pcluster struct {
	t     *testing.T
	bin   string
	cfg   string
	dir   string
	peers []config.Peer
	hosts map[uint64]*lab.Host // nil: loopback
	procs map[uint64]*proc
	args  []string // extra flags of every serve
}

func newProcCluster(t *testing.T, n int, l *lab.Lab, extra string, args ...string) *pcluster {
	t.Helper()
	c := &pcluster{t: t, bin: bpftest.KedgeBinary(t), dir: t.TempDir(), procs: map[uint64]*proc{}, args: args}
	var b strings.Builder
	// A 300 ms election timeout: the test machine is shared and often loaded, and a leader
	// change in the middle of a test step only makes the test slower, not wrong.
	fmt.Fprintf(&b, "cluster_id: 77\ndata_dir: %s/n{id}\nrequest_timeout: 2s\nelection_ticks: 30\n%speers:\n", c.dir, extra)
	for i := 1; i <= n; i++ {
		p := config.Peer{ID: uint64(i)}
		if l != nil {
			h := l.Hosts[i-1]
			if c.hosts == nil {
				c.hosts = map[uint64]*lab.Host{}
			}
			c.hosts[p.ID] = h
			p.Raft, p.Client = h.IPv4.String()+":7000", h.IPv4.String()+":8000"
		} else {
			p.Raft, p.Client = freeAddr(t), freeAddr(t)
		}
		c.peers = append(c.peers, p)
		fmt.Fprintf(&b, "  - {id: %d, raft: %q, client: %q}\n", p.ID, p.Raft, p.Client)
	}
	c.cfg = filepath.Join(c.dir, "cluster.yaml")
	if err := os.WriteFile(c.cfg, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for id := range c.procs {
			c.kill(id)
		}
	})
	for i := 1; i <= n; i++ {
		c.start(uint64(i))
	}
	return c
}

func (c *pcluster) logPath(id uint64) string {
	return filepath.Join(c.dir, fmt.Sprintf("node%d.log", id))
}

func (c *pcluster) start(id uint64) {
	c.t.Helper()
	logf, err := os.OpenFile(c.logPath(id), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(c.bin, append([]string{"raft", "serve", "--config", c.cfg, "--id", fmt.Sprint(id)}, c.args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if h := c.hosts[id]; h != nil {
		err = h.Start(cmd)
	} else {
		err = cmd.Start()
	}
	if err != nil {
		c.t.Fatalf("start node %d: %v", id, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	c.procs[id] = p
}

// kill sends SIGKILL and waits for the process.
func (c *pcluster) kill(id uint64) {
	p := c.procs[id]
	if p == nil {
		return
	}
	p.cmd.Process.Kill()
	<-p.done
	delete(c.procs, id)
	// A killed node cannot remove what it made (its kernel heartbeats' pacer namespace).
	if _, err := netnsx.CleanupStaleOf(p.cmd.Process.Pid); err != nil {
		c.t.Errorf("clean up after node %d: %v", id, err)
	}
}

// client returns a client of the given nodes; in a lab its connections are made inside
// the first node's namespace (the test process is not on the lab's networks).
func (c *pcluster) client(ids ...uint64) *client.Client {
	cl := &client.Client{HTTP: &http.Client{Timeout: 5 * time.Second}}
	for _, id := range ids {
		cl.Endpoints = append(cl.Endpoints, c.peers[id-1].Client)
	}
	if h := c.hosts[ids[0]]; h != nil {
		cl.HTTP.Transport = &http.Transport{DisableKeepAlives: true,
			DialContext: func(ctx context.Context, network, addr string) (conn net.Conn, err error) {
				if nerr := h.Do(func() error {
					var d net.Dialer
					conn, err = d.DialContext(ctx, network, addr)
					return nil
				}); nerr != nil {
					return nil, nerr
				}
				return conn, err
			}}
	}
	return cl
}

func (c *pcluster) status(id uint64) (api.Status, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return c.client(id).Status(ctx, c.peers[id-1].Client)
}

// waitFor polls cond until it holds or the deadline passes.
func (c *pcluster) waitFor(what string, d time.Duration, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out after %v waiting for %s\n%s", d, what, c.logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitLeader waits until the given nodes agree on a leader among them.
func (c *pcluster) waitLeader(ids ...uint64) uint64 {
	c.t.Helper()
	var lead uint64
	c.waitFor(fmt.Sprintf("a leader among %v", ids), 20*time.Second, func() bool {
		lead = 0
		for _, id := range ids {
			s, err := c.status(id)
			if err != nil || s.Leader == 0 || (lead != 0 && s.Leader != lead) {
				return false
			}
			lead = s.Leader
		}
		for _, id := range ids {
			if id == lead {
				return true
			}
		}
		return false
	})
	return lead
}

// put retries a write that failed without effect (503, refused) until it is acknowledged.
func (c *pcluster) put(cl *client.Client, key, value string) api.WriteResponse {
	c.t.Helper()
	var res api.WriteResponse
	c.waitFor("put "+key, 20*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		var err error
		res, err = cl.Put(ctx, key, value)
		if client.Unknown(err) {
			c.t.Fatalf("put %s: %v", key, err)
		}
		return err == nil
	})
	return res
}

func (c *pcluster) get(cl *client.Client, key string) api.GetResponse {
	c.t.Helper()
	var res api.GetResponse
	c.waitFor("get "+key, 20*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		var err error
		res, err = cl.Get(ctx, key)
		return err == nil
	})
	return res
}

func (c *pcluster) logs() string {
	var b strings.Builder
	for _, p := range c.peers {
		data, _ := os.ReadFile(c.logPath(p.ID))
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) > 15 {
			lines = lines[len(lines)-15:]
		}
		fmt.Fprintf(&b, "--- node %d (last lines)\n%s\n", p.ID, strings.Join(lines, "\n"))
	}
	return b.String()
}

// TestProcessKillAllRestart: every acknowledged write survives SIGKILL of every node at once
// and a full restart.
func TestProcessKillAllRestart(t *testing.T) {
	c := newProcCluster(t, 3, nil, "")
	c.waitLeader(1, 2, 3)
	const n = 30
	acked := map[string]string{}
	for i := range n {
		cl := c.client(uint64(i%3 + 1)) // through every node
		k, v := fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i)
		c.put(cl, k, v)
		acked[k] = v
	}
	for id := uint64(1); id <= 3; id++ {
		c.kill(id)
	}
	for id := uint64(1); id <= 3; id++ {
		c.start(id)
	}
	c.waitLeader(1, 2, 3)
	for id := uint64(1); id <= 3; id++ {
		cl := c.client(id)
		for k, v := range acked {
			if g := c.get(cl, k); !g.Found || g.Value != v {
				t.Fatalf("after kill -9 of all nodes, node %d reads %s = %+v, want %q", id, k, g, v)
			}
		}
	}
}

// TestProcessCatchUp: a node that was down catches up by log when the leader still has the
// entries it missed, and by snapshot when the leader compacted them away.
func TestProcessCatchUp(t *testing.T) {
	c := newProcCluster(t, 3, nil, "snapshot_entries: 100\nkeep_entries: 20\n")
	lead := c.waitLeader(1, 2, 3)
	lag := lead%3 + 1 // a follower
	var others []uint64
	for id := uint64(1); id <= 3; id++ {
		if id != lag {
			others = append(others, id)
		}
	}
	cl := c.client(others...)
	caughtUp := func(key, want string) {
		t.Helper()
		// A linearizable read through the lagging node: it must have applied the last write.
		if g := c.get(c.client(lag), key); !g.Found || g.Value != want {
			t.Fatalf("node %d reads %s = %+v, want %q", lag, key, g, want)
		}
	}

	// By log: 10 entries while down, well inside the 20 the leader keeps.
	c.kill(lag)
	for i := range 10 {
		c.put(cl, "log", fmt.Sprint(i))
	}
	c.start(lag)
	caughtUp("log", "9")
	if logHas(t, c.logPath(lag), "installed snapshot from leader") {
		t.Fatalf("node %d installed a snapshot for a 10-entry gap", lag)
	}

	// By snapshot: 250 entries while down; the leader snapshots every 100 and keeps 20.
	c.kill(lag)
	for i := range 250 {
		c.put(cl, "snap", fmt.Sprint(i))
	}
	c.start(lag)
	caughtUp("snap", "249")
	caughtUp("log", "9")
	if !logHas(t, c.logPath(lag), "installed snapshot from leader") {
		t.Fatalf("node %d caught up without a snapshot although the leader compacted its log\n%s", lag, c.logs())
	}
	s, err := c.status(lag)
	if err != nil || s.SnapshotIndex < 100 {
		t.Fatalf("node %d status after catch-up: %+v %v", lag, s, err)
	}
}

func logHas(t *testing.T, path, s string) bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(b), s)
}

// TestLabPartition: 5 nodes in lab namespaces; the fault fabric (below the nodes'
// interfaces) cuts the leader and one follower off. The minority makes no progress; the
// majority elects a leader and commits; after healing, the minority converges.
func TestLabPartition(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and loads the fabric's BPF program")
	}
	names := []string{"r1", "r2", "r3", "r4", "r5"}
	l := routerLab(t, "rpart", names...)
	f, err := l.Faults()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	c := newProcCluster(t, 5, l, "")
	all := []uint64{1, 2, 3, 4, 5}
	lead := c.waitLeader(all...)
	c.put(c.client(lead), "x", "before")

	other := lead%5 + 1
	minority := []uint64{lead, other}
	var majority []uint64
	for _, id := range all {
		if id != lead && id != other {
			majority = append(majority, id)
		}
	}
	name := func(ids []uint64) []string {
		var s []string
		for _, id := range ids {
			s = append(s, names[id-1])
		}
		return s
	}
	if err := f.Partition(name(minority), name(majority)); err != nil {
		t.Fatal(err)
	}
	commitOf := func(ids []uint64) map[uint64]uint64 {
		m := map[uint64]uint64{}
		for _, id := range ids {
			if s, err := c.status(id); err == nil {
				m[id] = s.Commit
			}
		}
		return m
	}
	// The majority elects a new leader among itself and commits.
	newLead := c.waitLeader(majority...)
	if newLead == lead {
		t.Fatalf("old leader %d still leads the majority", lead)
	}
	// Measured after the election (at least one election timeout after the cut), so no
	// packet sent before the cut is still on its way.
	before := commitOf(minority)
	c.put(c.client(majority...), "x", "majority")

	// The minority: a write through it fails (no leader, or times out unknown); reads
	// fail too, and its commit index does not move.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	_, werr := c.client(minority...).Put(ctx, "x", "minority")
	cancel()
	if werr == nil {
		t.Fatalf("a write through the minority %v succeeded\n%s", minority, c.logs())
	}
	ctx, cancel = context.WithTimeout(context.Background(), 4*time.Second)
	g, rerr := c.client(minority...).Get(ctx, "x")
	cancel()
	if rerr == nil {
		t.Fatalf("a linearizable read through the minority %v answered %+v\n%s", minority, g, c.logs())
	}
	after := commitOf(minority)
	for id, ci := range before {
		if after[id] != ci {
			t.Errorf("minority node %d commit moved %d -> %d during the partition\n%s", id, ci, after[id], c.logs())
		}
	}
	var e *client.Error
	if !errors.As(werr, &e) {
		t.Fatalf("minority write error %v is not an API error", werr)
	}
	t.Logf("minority write: %v; read: %v", werr, rerr)

	// Heal: everyone converges on the majority's value; a write that was unknown in the
	// minority may or may not have been applied, but only the majority's history counts.
	if err := f.Heal(); err != nil {
		t.Fatal(err)
	}
	c.waitLeader(all...)
	for _, id := range minority {
		g := c.get(c.client(id), "x")
		if g.Value != "majority" && !(client.Unknown(werr) && g.Value == "minority") {
			t.Fatalf("node %d reads x = %+v after healing\n%s", id, g, c.logs())
		}
	}
	st, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Partitioned == 0 {
		t.Fatalf("the fabric dropped no packet: the partition did not happen (%+v)", st)
	}
	t.Logf("fabric: %+v", st)
}

// TestUnsafeLocalReadsAreStale shows that the checker's deliberately broken mode is broken,
// and the normal mode is not, in the same situation: a node that missed an acknowledged
// write comes back while the others are down. With --unsafe-local-reads it answers the old
// value; without, it refuses (no leader). docs/raft.md section 7.
func TestUnsafeLocalReadsAreStale(t *testing.T) {
	for _, unsafe := range []bool{true, false} {
		t.Run(fmt.Sprintf("unsafe=%v", unsafe), func(t *testing.T) {
			c := newProcCluster(t, 3, nil, "")
			if unsafe {
				c.args = []string{"--unsafe-local-reads"}
				for id := uint64(1); id <= 3; id++ { // restart with the flag
					c.kill(id)
					c.start(id)
				}
			}
			lead := c.waitLeader(1, 2, 3)
			lag := lead%3 + 1
			old := c.put(c.client(lead), "x", "old")
			c.waitFor("x=old applied everywhere", 10*time.Second, func() bool {
				s, err := c.status(lag)
				l, lerr := c.status(lead)
				return err == nil && lerr == nil && s.Applied >= l.Commit
			})
			c.kill(lag)
			w := c.put(c.client(lead), "x", "new") // acknowledged by lead + the third node
			for id := uint64(1); id <= 3; id++ {
				c.kill(id)
			}
			c.start(lag)
			c.waitFor("the lone node up, x=old applied", 10*time.Second, func() bool {
				s, err := c.status(lag)
				return err == nil && s.Applied >= old.Index
			})
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			g, err := c.client(lag).Get(ctx, "x")
			if unsafe {
				if err != nil || g.Value != "old" {
					t.Fatalf("unsafe read on the lone node: %+v %v, want the stale value \"old\"", g, err)
				}
				t.Logf("unsafe mode: read x=%q at index %d after x=\"new\" was acknowledged at index %d", g.Value, g.Index, w.Index)
				return
			}
			var e *client.Error
			if !errors.As(err, &e) || e.Status != http.StatusServiceUnavailable {
				t.Fatalf("a read on a lone node: %+v %v, want a 503 (no leader)", g, err)
			}
		})
	}
}
