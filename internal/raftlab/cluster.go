package raftlab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/raft/client"
)

// Ports every node uses on its own address.
const (
	RaftPort   = 7000
	ClientPort = 8000
	// ClientHost is the lab host the harness's clients run in (its links cross the fabric
	// too; node-to-node faults leave them alone unless asked).
	ClientHost = "client"
	ClusterID  = 42 // the cluster id of every lab cluster
)

// Spec declares a lab cluster.
type Spec struct {
	Name   string // lab name (namespaces kedge-<pid>-<name>-..., or kedge-lab-<name>-... if Persistent)
	Nodes  int    // 3, 5 or 7
	Binary string // the kedge binary that runs `raft serve`
	Dir    string // configs, data directories and node logs
	// Raft timing (docs/raft.md section 1); zero: the node's defaults (10ms, 10, 1).
	Tick           time.Duration
	ElectionTicks  int
	HeartbeatTicks int
	// UnsafeLocalReads starts the nodes in the deliberately broken mode (for the checker's
	// self-test): reads from local state without ReadIndex.
	UnsafeLocalReads bool
	Persistent       bool
	// Args are extra flags of every `raft serve` (e.g. --offload=false).
	Args []string
	// ClusterKey (32 hex digits) goes into the config: every UDP packet is authenticated.
	ClusterKey string
	// Server is what the nodes run: ServerKedge ("" too: kedge raft serve) or ServerEtcd
	// (Debian's etcd, the peer of `kedge bench raft --peer etcd`: Binary, UnsafeLocalReads
	// and ClusterKey do not apply, Args are etcd's flags; etcd.go).
	Server string
	// NodeDisks gives every node a filesystem of its own (lab.Disk: ext4 on a loop device,
	// mounted over Dir/data in the node's own mount namespace), so that the disk-stall
	// fault stalls one node's disk and no other's. Without it the nodes' data share the
	// filesystem of Dir, and with it its journal: a stalled node's writes then hold up the
	// others' fsyncs.
	NodeDisks bool
	// DiskNodes gives only the nodes named a disk of their own (as NodeDisks does every
	// node); the others' data directories share the filesystem of Dir. The benchmark's
	// disk-stall runs put only the node they stall on one: a loop device's writes and
	// flushes are carried by kernel threads that wait behind CPU stress (an fdatasync p90
	// of 17 ms against 1.4 ms on the VM disk's ext4 with two spinners per CPU), latency a
	// node's real disk would not add, while the stalled node must not share a journal with
	// the others (its throttled writes would hold up their fsyncs).
	DiskNodes []int
}

// hasDisk reports whether node id gets a disk of its own.
func (s Spec) hasDisk(id int) bool { return s.NodeDisks || slices.Contains(s.DiskNodes, id) }

// Etcd reports whether the nodes run etcd.
func (s Spec) Etcd() bool { return s.Server == ServerEtcd }

// Node is one node process.
type Node struct {
	ID         int
	Host       *lab.Host
	RaftAddr   netip.AddrPort
	ClientAddr netip.AddrPort

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// Cluster is a running lab cluster: the lab, its fault fabric and the node processes.
type Cluster struct {
	Spec   Spec
	Lab    *lab.Lab
	Faults *lab.FaultFabric
	Client *lab.Host
	Nodes  []*Node
	Config string // the shared node config file

	status  *client.Client
	etcd    *etcdClients // Spec.Etcd(): the harness's etcd clients
	disks   []*lab.Disk  // Spec.NodeDisks, DiskNodes: node id's at id-1 (nil: none of its own)
	onClose []func() error
}

// OnClose runs f when the cluster closes, before its nodes are killed and its lab removed
// (something attached to the cluster's hosts from outside, such as a benchmark's control
// program).
func (c *Cluster) OnClose(f func() error) { c.onClose = append(c.onClose, f) }

// NodeName is the lab host name of node id.
func NodeName(id int) string { return fmt.Sprintf("n%d", id) }

// Up builds the lab (a router fabric with hosts n1..nN and the client host), attaches the
// fault fabric, writes the config and starts every node, and waits until each answers
// /v1/status and one of them leads.
func Up(ctx context.Context, spec Spec) (_ *Cluster, err error) {
	switch spec.Nodes {
	case 3, 5, 7:
	default:
		return nil, fmt.Errorf("lab cluster of %d nodes: use 3, 5 or 7", spec.Nodes)
	}
	for _, id := range spec.DiskNodes {
		if id < 1 || id > spec.Nodes {
			return nil, fmt.Errorf("disk of node %d: the cluster has nodes 1 to %d", id, spec.Nodes)
		}
	}
	switch {
	case spec.Etcd():
		if err := checkEtcd(); err != nil {
			return nil, err
		}
		if spec.Dir == "" {
			return nil, errors.New("lab cluster needs a directory")
		}
	case spec.Server != "" && spec.Server != ServerKedge:
		return nil, fmt.Errorf("lab cluster server %q: use %s or %s", spec.Server, ServerKedge, ServerEtcd)
	case spec.Binary == "" || spec.Dir == "":
		return nil, errors.New("lab cluster needs the kedge binary and a directory")
	}
	hosts := make([]string, 0, spec.Nodes+1)
	for i := 1; i <= spec.Nodes; i++ {
		hosts = append(hosts, NodeName(i))
	}
	hosts = append(hosts, ClientHost)
	c := &Cluster{Spec: spec}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Close())
		}
	}()
	if c.Lab, err = lab.Up(lab.Spec{Name: spec.Name, Fabric: lab.Router, Hosts: hosts, Persistent: spec.Persistent}); err != nil {
		return nil, err
	}
	if c.Faults, err = c.Lab.Faults(); err != nil {
		return nil, err
	}
	c.Client = c.Lab.Host(ClientHost)
	c.status = NewClient(c.Client, time.Second)
	if spec.Etcd() {
		c.etcd = &etcdClients{status: map[int]*clientv3.Client{}, members: map[uint64]int{}}
	}
	for i := 1; i <= spec.Nodes; i++ {
		h := c.Lab.Host(NodeName(i))
		c.Nodes = append(c.Nodes, &Node{ID: i, Host: h,
			RaftAddr: netip.AddrPortFrom(h.IPv4, RaftPort), ClientAddr: netip.AddrPortFrom(h.IPv4, ClientPort)})
	}
	if err := c.writeConfig(); err != nil {
		return nil, err
	}
	if spec.NodeDisks || len(spec.DiskNodes) > 0 {
		if err := c.makeDisks(); err != nil {
			return nil, err
		}
	}
	for _, n := range c.Nodes {
		if err := c.Start(n.ID); err != nil {
			return nil, err
		}
	}
	for _, n := range c.Nodes {
		if err := c.WaitReady(ctx, n.ID); err != nil {
			return nil, err
		}
	}
	if _, err := c.WaitLeader(ctx, nil); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Cluster) writeConfig() error {
	if err := os.MkdirAll(c.Spec.Dir, 0o755); err != nil {
		return fmt.Errorf("make cluster dir: %w", err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# written by the kedge raft lab\ncluster_id: %d\ndata_dir: %s\npeers:\n", ClusterID, filepath.Join(c.Spec.Dir, "data", "{id}"))
	for _, n := range c.Nodes {
		fmt.Fprintf(&b, "  - id: %d\n    raft: %s\n    client: %s\n", n.ID, n.RaftAddr, n.ClientAddr)
	}
	if c.Spec.Tick > 0 {
		fmt.Fprintf(&b, "tick: %s\n", c.Spec.Tick)
	}
	if c.Spec.ElectionTicks > 0 {
		fmt.Fprintf(&b, "election_ticks: %d\n", c.Spec.ElectionTicks)
	}
	if c.Spec.HeartbeatTicks > 0 {
		fmt.Fprintf(&b, "heartbeat_ticks: %d\n", c.Spec.HeartbeatTicks)
	}
	if c.Spec.ClusterKey != "" {
		fmt.Fprintf(&b, "cluster_key: %s\n", c.Spec.ClusterKey)
	}
	c.Config = filepath.Join(c.Spec.Dir, "cluster.yaml")
	if err := os.WriteFile(c.Config, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("write cluster config: %w", err)
	}
	return nil
}

// Node returns node id (1-based).
func (c *Cluster) Node(id int) *Node {
	if id < 1 || id > len(c.Nodes) {
		return nil
	}
	return c.Nodes[id-1]
}

// LogPath is node id's log file (stderr and stdout, appended across restarts).
func (c *Cluster) LogPath(id int) string {
	return filepath.Join(c.Spec.Dir, fmt.Sprintf("node%d.log", id))
}

// Start starts node id's process (again, after Kill: from its data directory).
func (c *Cluster) Start(id int) error {
	n := c.Node(id)
	if n == nil {
		return fmt.Errorf("no node %d", id)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		return fmt.Errorf("node %d is running (pid %d)", id, n.cmd.Process.Pid)
	}
	logf, err := os.OpenFile(c.LogPath(id), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open node log: %w", err)
	}
	defer logf.Close() // the child has its own copy
	var cmd *exec.Cmd
	if c.Spec.Etcd() {
		cmd = c.etcdCommand(n)
	} else {
		args := []string{"raft", "serve", "--config", c.Config, "--id", strconv.Itoa(id)}
		if c.Spec.UnsafeLocalReads {
			args = append(args, "--unsafe-local-reads")
		}
		args = append(args, c.Spec.Args...)
		cmd = n.Host.Command(c.Spec.Binary, args...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if !c.Spec.Persistent {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	} else {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	}
	if d := c.Disk(id); d != nil {
		d.Mount(cmd, c.disksDir())
	}
	if err := n.Host.Start(cmd); err != nil {
		return fmt.Errorf("start node %d: %w", id, err)
	}
	n.cmd, n.exited = cmd, make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) {
		_ = cmd.Wait()
		close(exited)
	}(cmd, n.exited)
	return nil
}

// PID returns node id's process id, 0 when it is not running.
func (c *Cluster) PID(id int) int {
	n := c.Node(id)
	if n == nil {
		return 0
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return 0
	}
	return n.cmd.Process.Pid
}

// Kill sends SIGKILL to node id and waits for the process to be gone.
func (c *Cluster) Kill(id int) error {
	n := c.Node(id)
	if n == nil {
		return fmt.Errorf("no node %d", id)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return nil
	}
	_ = n.cmd.Process.Signal(syscall.SIGCONT) // a paused node dies as well
	if err := n.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill node %d: %w", id, err)
	}
	<-n.exited
	pid := n.cmd.Process.Pid
	n.cmd = nil
	// A killed node cannot remove what it made (its pacer's namespace with --kernel-heartbeats).
	if _, err := netnsx.CleanupStaleOf(pid); err != nil {
		return fmt.Errorf("kill node %d: %w", id, err)
	}
	return nil
}

// dataDir is node id's data directory (the config's data_dir; etcd's --data-dir).
func (c *Cluster) dataDir(id int) string {
	return filepath.Join(c.disksDir(), strconv.Itoa(id))
}

// disksDir is the parent of the nodes' data directories: a node with a disk of its own
// (Spec.NodeDisks, DiskNodes) has it mounted over disksDir in its mount namespace (seen
// from the harness and the other nodes, what is there is theirs), and its data directory
// is on its own disk.
func (c *Cluster) disksDir() string { return filepath.Join(c.Spec.Dir, "data") }

// makeDisks makes a disk for each node that has one (Spec.NodeDisks, DiskNodes).
func (c *Cluster) makeDisks() error {
	if err := os.MkdirAll(c.disksDir(), 0o755); err != nil {
		return fmt.Errorf("make data dir: %w", err)
	}
	c.disks = make([]*lab.Disk, len(c.Nodes))
	for _, n := range c.Nodes {
		if !c.Spec.hasDisk(n.ID) {
			continue
		}
		d, err := lab.NewDisk(c.Spec.Name+"-"+NodeName(n.ID), 0)
		if err != nil {
			return err
		}
		c.disks[n.ID-1] = d
	}
	return nil
}

// Disk is node id's own disk (nil if it has none: Spec.NodeDisks, DiskNodes).
func (c *Cluster) Disk(id int) *lab.Disk {
	if id < 1 || id > len(c.disks) {
		return nil
	}
	return c.disks[id-1]
}

// StallIOPS is the disk-stall fault's default: 10 write requests a second, so that a
// node's fsync of an append (data and metadata) takes a few hundred milliseconds.
const StallIOPS = 10

// StallDisk stalls node id's disk: its process's writes to the disk holding its data are
// limited to writeIOPS (0: StallIOPS) requests a second until the returned stall's Stop (a
// node that is killed and started again runs unthrottled).
func (c *Cluster) StallDisk(id, writeIOPS int) (*lab.DiskStall, error) {
	pid := c.PID(id)
	if pid == 0 {
		return nil, fmt.Errorf("stall disk of node %d: it does not run", id)
	}
	if writeIOPS == 0 {
		writeIOPS = StallIOPS
	}
	// The disk that holds the node's data as the node sees it (its own disk is mounted in
	// its own mount namespace).
	root := fmt.Sprintf("/proc/%d/root", pid)
	dir := filepath.Join(root, c.dataDir(id))
	if _, err := os.Stat(dir); err != nil {
		dir = filepath.Join(root, c.disksDir())
	}
	return lab.StallDisk(pid, dir, writeIOPS)
}

// Running reports whether node id's process runs (it may have exited on its own).
func (c *Cluster) Running(id int) bool {
	n := c.Node(id)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return false
	}
	select {
	case <-n.exited:
		return false
	default:
		return true
	}
}

// Status asks node id.
func (c *Cluster) Status(ctx context.Context, id int) (Status, error) {
	if c.Spec.Etcd() {
		return c.etcdStatus(ctx, id)
	}
	return c.status.Status(ctx, c.Node(id).ClientAddr.String())
}

// WaitReady waits until node id answers /v1/status (or its process exits).
func (c *Cluster) WaitReady(ctx context.Context, id int) error {
	for {
		if _, err := c.Status(ctx, id); err == nil {
			return nil
		}
		if !c.Running(id) {
			return fmt.Errorf("node %d exited before it was ready: see %s", id, c.LogPath(id))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %d not ready: %w (log %s)", id, ctx.Err(), c.LogPath(id))
		case <-time.After(5 * time.Millisecond): // polling the node's readiness
		}
	}
}

// Leader returns the id of the node that claims leadership in the highest term among the
// nodes that answer (0: none), and that term.
func (c *Cluster) Leader(ctx context.Context, among []int) (id int, term uint64) {
	if among == nil {
		for _, n := range c.Nodes {
			among = append(among, n.ID)
		}
	}
	for _, i := range among {
		st, err := c.Status(ctx, i)
		if err == nil && st.State == "leader" && st.Term >= term {
			id, term = i, st.Term
		}
	}
	return id, term
}

// WaitLeader waits until one of among (nil: all nodes) leads.
func (c *Cluster) WaitLeader(ctx context.Context, among []int) (int, error) {
	for {
		if id, _ := c.Leader(ctx, among); id != 0 {
			return id, nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("no leader: %w", ctx.Err())
		case <-time.After(5 * time.Millisecond): // polling the nodes' state
		}
	}
}

// Close stops every node (SIGKILL: the WAL makes a clean stop unnecessary), the fault
// fabric and the lab. The directory stays (logs, data) for the caller to keep or remove.
func (c *Cluster) Close() error {
	var errs []error
	for _, f := range c.onClose {
		errs = append(errs, f())
	}
	c.onClose = nil
	for _, n := range c.Nodes {
		errs = append(errs, c.Kill(n.ID))
	}
	if c.status != nil {
		c.status.Close()
	}
	errs = append(errs, c.etcd.close())
	if c.Faults != nil {
		errs = append(errs, c.Faults.Close())
	}
	if c.Lab != nil {
		errs = append(errs, c.Lab.Close())
	}
	for _, d := range c.disks {
		errs = append(errs, d.Close())
	}
	c.disks = nil
	return errors.Join(errs...)
}
