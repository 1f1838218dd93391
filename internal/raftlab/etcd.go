package raftlab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/kedge-dev/kedge/internal/lab"
)

// etcd as the cluster's server: the peer kedge raft is compared with (`kedge bench raft
// --peer etcd`). Each node runs Debian's etcd (etcd-server, 3.4) in its lab host, with its
// peer URL on RaftPort and its client URL on ClientPort, so the lab, the fabric, the fault
// operations and the harness's polling are the same for both systems.

// Servers a lab cluster can run.
const (
	ServerKedge = "kedge"
	ServerEtcd  = "etcd"
)

// EtcdBinary is the etcd server the lab runs (Debian's etcd-server; scripts/deps.sh).
var EtcdBinary = "etcd"

// EtcdTiming is etcd's heartbeat interval and election timeout (ms) for a cluster whose
// kedge nodes would run tick and electionTicks (0: the nodes' defaults, 10 ms and 10). etcd's own tick is its heartbeat interval,
// in whole milliseconds, and it refuses an election timeout below five of them: the
// heartbeat is a tenth of the election timeout (etcd's tuning guide's ratio), at least 1 ms.
func EtcdTiming(tick time.Duration, et int) (heartbeatMs, electionMs int) {
	if tick <= 0 {
		tick = 10 * time.Millisecond
	}
	if et <= 0 {
		et = 10
	}
	electionMs = max(int((time.Duration(et)*tick+time.Millisecond/2)/time.Millisecond), 5)
	return max(electionMs/10, 1), electionMs
}

// etcdCommand is node n's etcd command line. A restart passes the same flags: etcd ignores
// the --initial-* ones once its data directory exists.
func (c *Cluster) etcdCommand(n *Node) *exec.Cmd {
	url := func(a netip.AddrPort) string { return "http://" + a.String() }
	var initial []string
	for _, p := range c.Nodes {
		initial = append(initial, fmt.Sprintf("%s=%s", NodeName(p.ID), url(p.RaftAddr)))
	}
	hb, el := EtcdTiming(c.Spec.Tick, c.Spec.ElectionTicks)
	args := []string{
		"--name", NodeName(n.ID),
		"--data-dir", c.dataDir(n.ID),
		"--listen-peer-urls", url(n.RaftAddr), "--initial-advertise-peer-urls", url(n.RaftAddr),
		"--listen-client-urls", url(n.ClientAddr), "--advertise-client-urls", url(n.ClientAddr),
		"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
		"--initial-cluster-token", "kedge-lab-" + c.Spec.Name,
		"--heartbeat-interval", strconv.Itoa(hb), "--election-timeout", strconv.Itoa(el),
		// etcd-raft's pre-vote, as kedge's nodes run it (the default from etcd 3.5 on).
		"--pre-vote=true",
		// Errors only: etcd logs a warning per slow request, which a loaded machine makes
		// many of; kedge's nodes log nothing per request either.
		"--logger", "zap", "--log-outputs", "stderr", "--log-level", "error",
	}
	args = append(args, c.Spec.Args...)
	return n.Host.Command(EtcdBinary, args...)
}

// etcdClients are the harness's etcd clients: one per node for its status (the node's
// own view, as kedge's GET /v1/status gives it) and the member ids of the nodes.
type etcdClients struct {
	mu      sync.Mutex
	status  map[int]*clientv3.Client
	members map[uint64]int // etcd member id -> node id
}

// NewEtcdClient returns etcd's Go client (clientv3) for the nodes at endpoints, dialling
// from lab host h (so its traffic crosses the fabric); timeout bounds the dial. As an
// application's client: every request goes to one endpoint of its balancer (round robin
// over several), a follower forwards a write to the leader.
func NewEtcdClient(h *lab.Host, endpoints []netip.AddrPort, timeout time.Duration) (*clientv3.Client, error) {
	var eps []string
	for _, e := range endpoints {
		eps = append(eps, "http://"+e.String())
	}
	d := &net.Dialer{Timeout: timeout}
	return clientv3.New(clientv3.Config{
		Endpoints:   eps,
		DialTimeout: timeout,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (c net.Conn, err error) {
			err = h.Do(func() error { c, err = d.DialContext(ctx, "tcp", addr); return err })
			return c, err
		})},
	})
}

// etcdStatus is node id's view in kedge's status form: the member's raft term, commit and
// applied index, and the leader it knows (Maintenance.Status).
func (c *Cluster) etcdStatus(ctx context.Context, id int) (Status, error) {
	n := c.Node(id)
	if n == nil {
		return Status{}, fmt.Errorf("no node %d", id)
	}
	e := c.etcd
	e.mu.Lock()
	cl := e.status[id]
	e.mu.Unlock()
	if cl == nil {
		var err error
		if cl, err = NewEtcdClient(c.Client, []netip.AddrPort{n.ClientAddr}, time.Second); err != nil {
			return Status{}, fmt.Errorf("etcd client of node %d: %w", id, err)
		}
		e.mu.Lock()
		if prev := e.status[id]; prev != nil {
			cl.Close()
			cl = prev
		} else {
			e.status[id] = cl
		}
		e.mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	// The RPC on the client's one connection (Maintenance.Status would dial anew each time).
	r, err := pb.NewMaintenanceClient(cl.ActiveConnection()).Status(ctx, &pb.StatusRequest{})
	if err != nil {
		return Status{}, fmt.Errorf("status of etcd node %d: %w", id, err)
	}
	leader, err := c.etcdMember(ctx, cl, r.GetLeader())
	if err != nil {
		return Status{}, err
	}
	st := Status{ID: uint64(id), ClusterID: ClusterID, State: "follower", Leader: uint64(leader),
		Term: r.GetRaftTerm(), Commit: r.GetRaftIndex(), Applied: r.GetRaftAppliedIndex(), LastIndex: r.GetRaftIndex()}
	if r.GetLeader() != 0 && r.GetLeader() == r.GetHeader().GetMemberId() {
		st.State = "leader"
	}
	return st, nil
}

// etcdMember maps an etcd member id to its node id (0 for 0: no leader known), asking the
// cluster's member list the first time it sees the id.
func (c *Cluster) etcdMember(ctx context.Context, cl *clientv3.Client, member uint64) (int, error) {
	if member == 0 {
		return 0, nil
	}
	e := c.etcd
	e.mu.Lock()
	id, ok := e.members[member]
	e.mu.Unlock()
	if ok {
		return id, nil
	}
	ml, err := cl.MemberList(ctx)
	if err != nil {
		return 0, fmt.Errorf("etcd member list: %w", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, m := range ml.Members {
		if i, err := strconv.Atoi(strings.TrimPrefix(m.GetName(), "n")); err == nil {
			e.members[m.GetID()] = i
		}
	}
	if id, ok = e.members[member]; !ok {
		return 0, fmt.Errorf("etcd member %x is not a node of the lab cluster", member)
	}
	return id, nil
}

func (e *etcdClients) close() error {
	if e == nil {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	var errs []error
	for _, cl := range e.status {
		if err := cl.Close(); err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, err)
		}
	}
	e.status = nil
	return errors.Join(errs...)
}

// EtcdVersion is the etcd server's version ("etcd 3.4.23"), from its --version.
func EtcdVersion(ctx context.Context) (string, error) {
	if err := checkEtcd(); err != nil {
		return "", err
	}
	out, err := exec.CommandContext(ctx, EtcdBinary, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("etcd --version: %w", err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(l, "etcd Version: "); ok {
			return "etcd " + strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("etcd --version: no version in %q", out)
}

// checkEtcd says what to do when the etcd server is missing.
func checkEtcd() error {
	if _, err := exec.LookPath(EtcdBinary); err != nil {
		return fmt.Errorf("etcd server not found (%w): install it with apt-get install etcd-server (scripts/deps.sh does)", err)
	}
	return nil
}
