package node

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/pktbuild"
	"github.com/kedge-dev/kedge/internal/raft/offload"
	"github.com/kedge-dev/kedge/internal/raft/wire"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// The spoofer is this test binary run again (TestSpoofer) inside a lab host of its own: a
// separate process on the lab network, like an attacker on the nodes' LAN. It knows the
// cluster's addresses and ids but not its key.

const spoofEnv = "KEDGE_RAFT_SPOOF"

type spoofSpec struct {
	Cluster   uint64
	Target    uint64         // the node attacked
	TargetAt  netip.AddrPort // its raft address
	Victim    uint64         // a real peer the spoofer impersonates
	VictimAt  netip.AddrPort // that peer's raft address (forged as the source)
	Count     int            // packets of each kind
	WrongKey  wire.Key       `json:"-"`
	WrongKeyB []byte         // WrongKey travels as bytes: Key never prints
}

// spoofKinds are the packets the spoofer sends, each Count times, and the reason a node
// must refuse them with: forged packets from a real peer's address (raw socket, forged
// source), and packets from the spoofer's own address.
var spoofKinds = []struct {
	name    string
	forged  bool // source address and port forged as the victim's raft address
	reason  wire.Reason
	payload func(s spoofSpec, i int) []byte
}{
	{"TimeoutNow signed with a wrong key", true, wire.DropMAC, func(s spoofSpec, i int) []byte {
		return spoofMsg(s, s.Cluster, s.Victim, pb.MsgTimeoutNow, &s.WrongKey)
	}},
	{"unsigned vote at a high term", true, wire.DropMAC, func(s spoofSpec, i int) []byte {
		return spoofMsg(s, s.Cluster, s.Victim, pb.MsgVote, nil)
	}},
	{"another cluster's heartbeat", true, wire.DropCluster, func(s spoofSpec, i int) []byte {
		return spoofMsg(s, s.Cluster+1, s.Victim, pb.MsgHeartbeat, &s.WrongKey)
	}},
	{"unknown peer id", false, wire.DropPeer, func(s spoofSpec, i int) []byte {
		return spoofMsg(s, s.Cluster, 99, pb.MsgHeartbeat, &s.WrongKey)
	}},
	{"real peer id from the spoofer's address", false, wire.DropPeer, func(s spoofSpec, i int) []byte {
		return spoofMsg(s, s.Cluster, s.Victim, pb.MsgTimeoutNow, &s.WrongKey)
	}},
	{"truncated", false, wire.DropShort, func(s spoofSpec, i int) []byte {
		return spoofMsg(s, s.Cluster, s.Victim, pb.MsgHeartbeat, nil)[:60]
	}},
	{"bad magic", true, wire.DropMagic, func(s spoofSpec, i int) []byte {
		p := spoofMsg(s, s.Cluster, s.Victim, pb.MsgHeartbeat, nil)
		p[0] ^= 0xff
		return p
	}},
}

func spoofMsg(s spoofSpec, cluster, from uint64, typ pb.MessageType, key *wire.Key) []byte {
	p, err := wire.Encode(make([]byte, wire.PktLen), cluster, &pb.Message{Type: typ.Enum(),
		From: proto.Uint64(from), To: proto.Uint64(s.Target), Term: proto.Uint64(1 << 40),
		LogTerm: proto.Uint64(1 << 40), Index: proto.Uint64(1 << 40)})
	if err != nil {
		panic(err)
	}
	if key != nil {
		wire.NewSigner(key).Sign(p)
	}
	return p
}

// TestSpoofer is the spoofer process's body; it does nothing in a normal test run.
func TestSpoofer(t *testing.T) {
	env := os.Getenv(spoofEnv)
	if env == "" {
		t.Skip("the spoofer process of TestLabSpoof")
	}
	var s spoofSpec
	if err := json.Unmarshal([]byte(env), &s); err != nil {
		t.Fatal(err)
	}
	copy(s.WrongKey[:], s.WrongKeyB)
	raw, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW) // IP_HDRINCL
	if err != nil {
		t.Fatalf("raw socket: %v", err)
	}
	defer syscall.Close(raw)
	udp, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(s.TargetAt))
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	dst := &syscall.SockaddrInet4{Addr: s.TargetAt.Addr().As4()}
	sent := 0
	for _, k := range spoofKinds {
		for i := range s.Count {
			p := k.payload(s, i)
			if !k.forged {
				if _, err := udp.Write(p); err != nil {
					t.Fatalf("%s: %v", k.name, err)
				}
				sent++
				continue
			}
			frame := pktbuild.New().IPv4(pktbuild.IPv4{Src: s.VictimAt.Addr(), Dst: s.TargetAt.Addr()}).
				UDP(pktbuild.UDP{Src: s.VictimAt.Port(), Dst: s.TargetAt.Port()}).Payload(p).Build()
			if err := syscall.Sendto(raw, frame[14:], 0, dst); err != nil {
				t.Fatalf("%s: forged send: %v", k.name, err)
			}
			sent++
		}
	}
	fmt.Printf("spoofer: sent %d packets\n", sent)
}

// TestLabSpoof runs a keyed 3-node cluster in lab namespaces and, from a fourth lab host,
// a spoofer process that knows the addresses and ids but not the key. Its forged (wrong or
// no MAC, from a real peer's forged address), other-cluster, unknown-peer, impersonating and
// malformed packets must all be refused: with the kernel path on they are dropped and
// counted by reason in XDP and user space never sees one (its drop counters do not move);
// with --offload=false user space refuses the same packets for the same reasons. Either way
// no forged message is given to raft: the node's received counters of the forged types
// (MsgTimeoutNow: it would start an election at once) do not move.
func TestLabSpoof(t *testing.T) {
	bpftest.RequireRoot(t)
	for _, mode := range []struct {
		name    string
		offload bool
	}{{"offload", true}, {"user space", false}} {
		t.Run(mode.name, func(t *testing.T) {
			if mode.offload {
				if err := offload.Probe(); err != nil {
					t.Skipf("skipping: %v", err)
				}
			}
			spoofLab(t, mode.offload)
		})
	}
}

func spoofLab(t *testing.T, kernel bool) {
	l := routerLab(t, "rspf", "n1", "n2", "n3", "spoof")
	c := newProcCluster(t, 3, l, labKey)
	if !kernel {
		c.args = []string{"--offload=false"}
		for id := uint64(1); id <= 3; id++ {
			c.kill(id)
			c.start(id)
		}
	}
	lead := c.waitLeader(1, 2, 3)
	target := lead%3 + 1
	victim := target%3 + 1
	c.put(c.client(lead), "x", "1")
	st, err := c.status(target)
	if err != nil {
		t.Fatal(err)
	}
	if on := strings.HasPrefix(st.Offload, "xdp-"); on != kernel {
		t.Fatalf("node %d reports offload %q, want the XDP path on = %v", target, st.Offload, kernel)
	}

	const count = 25
	want := map[wire.Reason]uint64{}
	for _, k := range spoofKinds {
		want[k.reason] += count
	}
	userDrops := func() map[wire.Reason]float64 {
		m := map[wire.Reason]float64{}
		for r := range want {
			v, err := c.metric(target, "kedge_raft_transport_dropped_total", fmt.Sprintf("reason=%q", r.String()))
			if err != nil {
				t.Fatal(err)
			}
			m[r] = v
		}
		return m
	}
	received := func(typ string) float64 {
		v, err := c.metric(target, "kedge_raft_transport_received_total", fmt.Sprintf("type=%q", typ))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	var before *offload.Inspection
	if kernel {
		if before, err = c.inspect(target); err != nil {
			t.Fatal(err)
		}
	}
	userBefore := userDrops()
	timeoutNowBefore := received("MsgTimeoutNow")

	wrong := wire.Key{0xde, 0xad}
	spec, _ := json.Marshal(spoofSpec{Cluster: 77, Target: target, TargetAt: netip.MustParseAddrPort(c.peers[target-1].Raft),
		Victim: victim, VictimAt: netip.MustParseAddrPort(c.peers[victim-1].Raft), Count: count, WrongKeyB: wrong[:]})
	h := l.Host("spoof")
	cmd := exec.Command(os.Args[0], "-test.run=^TestSpoofer$", "-test.v")
	cmd.Env = append(os.Environ(), spoofEnv+"="+string(spec))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := h.Start(cmd); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("spoofer: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), fmt.Sprintf("sent %d packets", count*len(spoofKinds))) {
		t.Fatalf("spoofer output:\n%s", out.String())
	}

	if kernel {
		var after *offload.Inspection
		c.waitFor("every spoofed packet dropped in XDP", 20*1e9, func() bool {
			after, err = c.inspect(target)
			if err != nil {
				return false
			}
			for r, n := range want {
				if after.Counters["drop_"+r.String()]-before.Counters["drop_"+r.String()] < n {
					return false
				}
			}
			return true
		})
		for r, n := range want {
			if d := after.Counters["drop_"+r.String()] - before.Counters["drop_"+r.String()]; d != n {
				t.Errorf("XDP drop_%s went up by %d, the spoofer sent %d", r, d, n)
			}
		}
		for r, v := range userDrops() {
			if v != userBefore[r] {
				t.Errorf("user space refused %v %s packets: they reached it", v-userBefore[r], r)
			}
		}
		t.Logf("node %d (XDP): %v", target, dropsOf(after, before, want))
		// The leader's transport took the followers' packets by the program's pass mark
		// (their MAC verified in XDP only), and refused none of them for their MAC.
		c.put(c.client(lead), "y", "2")
		marked, err := c.metric(lead, "kedge_raft_transport_pass_marked_total")
		if err != nil {
			t.Fatal(err)
		}
		if marked == 0 {
			t.Errorf("node %d (leader) accepted no packet by its pass mark", lead)
		}
		if v, err := c.metric(lead, "kedge_raft_transport_dropped_total", `reason="mac"`); err != nil || v != 0 {
			t.Errorf("node %d (leader) refused %v packets for their MAC (%v): the pass mark was not recognized", lead, v, err)
		}
		t.Logf("node %d (leader): %v packets accepted by the pass mark", lead, marked)
	} else {
		c.waitFor("every spoofed packet refused by user space", 20*1e9, func() bool {
			now := userDrops()
			for r, n := range want {
				if now[r]-userBefore[r] < float64(n) {
					return false
				}
			}
			return true
		})
		now := userDrops()
		for r, n := range want {
			if d := now[r] - userBefore[r]; d != float64(n) {
				t.Errorf("user space dropped %v %s packets, the spoofer sent %d", d, r, n)
			}
		}
		t.Logf("node %d (user space): dropped %v", target, now)
	}
	if v := received("MsgTimeoutNow"); v != timeoutNowBefore {
		t.Errorf("raft was given %v MsgTimeoutNow: a forged packet got through", v-timeoutNowBefore)
	}
	st2, err := c.status(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("node %d term %d before, %d after the spoofer", target, st.Term, st2.Term)
}

func dropsOf(after, before *offload.Inspection, want map[wire.Reason]uint64) map[string]uint64 {
	m := map[string]uint64{}
	for r := range want {
		k := "drop_" + r.String()
		m[k] = after.Counters[k] - before.Counters[k]
	}
	return m
}

// TestLabPreVoteInXDP: in a keyed 3-node lab cluster with the kernel paths on, kill -9 of
// the leader, three times: each time the survivors elect a new leader that takes a write,
// and over the three failovers the survivors' programs answered pre-votes in XDP
// (pv_answered: granted or refused from the durable mirror, signed on the kernel channel).
// The dead leader is restarted between rounds. The nodes run without the closed-connection
// failover (--close-failover=false): with it a survivor of a killed leader passes the next
// term's pre-votes up to user space by design (docs/raft.md section 14, "A leader whose
// connections closed"), and the program answers pre-votes in the failovers it leaves to the
// detector - a leader whose host dies without closing its sockets - which this test stands for.
func TestLabPreVoteInXDP(t *testing.T) {
	c := offloadCluster(t, "rpv", "--close-failover=false")
	counters := func(id uint64) map[string]uint64 {
		in, err := c.inspect(id)
		if err != nil {
			t.Fatal(err)
		}
		return in.Counters
	}
	var answered, passed, dropped uint64
	for round := range 3 {
		lead := c.waitLeader(1, 2, 3)
		c.put(c.client(lead), "x", fmt.Sprint(round))
		var rest []uint64
		before := map[uint64]map[string]uint64{}
		for id := uint64(1); id <= 3; id++ {
			if id != lead {
				rest = append(rest, id)
				before[id] = counters(id)
			}
		}
		c.kill(lead)
		newLead := c.waitLeader(rest...)
		c.put(c.client(newLead), "x", fmt.Sprint(round)+"b")
		for _, id := range rest {
			after := counters(id)
			answered += after["pv_answered"] - before[id]["pv_answered"]
			passed += after["pv_passed"] - before[id]["pv_passed"]
			dropped += after["pv_dropped"] - before[id]["pv_dropped"]
		}
		c.start(lead)
	}
	t.Logf("three failovers: pre-votes answered in XDP %d, passed to user space %d, dropped (lease) %d", answered, passed, dropped)
	if answered == 0 {
		t.Errorf("no pre-vote was answered in XDP in three failovers (passed %d, dropped %d)", passed, dropped)
	}
}

// labKey is the cluster key of the keyed lab clusters (newProcCluster's extra config).
const labKey = "cluster_key: 00112233445566778899aabbccddeeff\n"

// offloadCluster is a keyed 3-node cluster of real processes in a routed lab named name,
// with the kernel paths on by default; the test skips where the kernel cannot run them.
func offloadCluster(t *testing.T, name string, args ...string) *pcluster {
	t.Helper()
	bpftest.RequireRoot(t)
	if err := offload.Probe(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	return newProcCluster(t, 3, routerLab(t, name, "n1", "n2", "n3"), labKey, args...)
}

// routerLab builds a lab of hosts behind a router, removed when the test ends.
func routerLab(t *testing.T, name string, hosts ...string) *lab.Lab {
	t.Helper()
	l, err := lab.Up(lab.Spec{Name: name, Fabric: lab.Router, Hosts: hosts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("lab close: %v", err)
		}
	})
	return l
}
