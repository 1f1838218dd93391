package node

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/kedge-dev/kedge/internal/raft/config"
	"github.com/kedge-dev/kedge/internal/raft/offload"
	"github.com/kedge-dev/kedge/internal/raft/wire"
	"github.com/prometheus/client_golang/prometheus"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Offload says whether the node answers heartbeats and detects leader failure in the kernel
// (docs/raft.md "Kernel paths: follower").
type Offload int

const (
	// OffloadOff: everything in user space (part 1).
	OffloadOff Offload = iota
	// OffloadAuto: on where the kernel and the raft address allow it, else off with a log line.
	OffloadAuto
	// OffloadOn: on, or New fails (a *kedge.FeatureError where the kernel lacks something).
	OffloadOn
)

// synthContext marks the heartbeats the node synthesizes from the kernel's heartbeat record:
// etcd-raft echoes it in the MsgHeartbeatResp, which the node then does not send (the kernel
// already answered the real heartbeat). 12 bytes: never one of kedge's 8-byte read contexts.
var synthContext = []byte("kedge-xdp-hb")

// follower is the node's side of the follower kernel path.
type follower struct {
	k        *offload.Follower
	peers    map[uint64]netip.AddrPort
	detect   time.Duration
	aliveFor time.Duration

	feed      hbFeeder
	mirror    offload.Durable // last mirrored (term, lead as etcd-raft has it)
	lead      uint64
	mirrored  bool
	lastAlive time.Duration // CLOCK_MONOTONIC of the last Alive refresh

	wakeups *prometheus.CounterVec
}

// hbFeeder turns the kernel's heartbeat record into the etcd-raft step it stands for: one
// MsgHeartbeat per tick when heartbeats were answered since the last one, carrying the
// leader, the term and the highest commit they said. etcd-raft's follower does on a heartbeat
// exactly: electionElapsed = 0, lead = From, commitTo(Commit) (monotonic, so the highest of
// several is what several in a row leave), and a response (the kernel's).
type hbFeeder struct{ seen uint64 }

func (f *hbFeeder) next(hb offload.Heartbeat, self uint64) *pb.Message {
	if hb.Count == f.seen {
		return nil
	}
	f.seen = hb.Count
	m := &pb.Message{Type: pb.MsgHeartbeat.Enum(), From: proto.Uint64(hb.Leader), To: proto.Uint64(self),
		Term: proto.Uint64(hb.Term), Context: synthContext}
	if hb.Commit != 0 {
		m.Commit = proto.Uint64(hb.Commit)
	}
	return m
}

// isSynthResp reports whether m answers a synthesized heartbeat.
func isSynthResp(m *pb.Message) bool {
	return m.GetType() == pb.MsgHeartbeatResp && string(m.GetContext()) == string(synthContext)
}

// startOffload loads and attaches the follower program for the node's raft address.
func (n *Node) startOffload(mode Offload) error {
	if mode == OffloadOff {
		return nil
	}
	self, err := config.ResolveAddr(n.cfg.RaftBind())
	if err != nil {
		return fmt.Errorf("resolve raft address: %w", err)
	}
	et := time.Duration(n.cfg.ElectionTicks) * n.cfg.Tick
	f := &follower{peers: map[uint64]netip.AddrPort{}, detect: et, aliveFor: et}
	var allow []wire.AuthPeer
	for _, p := range n.cfg.Peers {
		a, err := config.ResolveAddr(p.Raft)
		if err != nil {
			return fmt.Errorf("resolve peer %d: %w", p.ID, err)
		}
		f.peers[p.ID] = a
		if p.ID != n.cfg.ID {
			allow = append(allow, wire.AuthPeer{ID: p.ID, Addr: a})
		}
	}
	f.k, err = offload.NewFollower(offload.FollowerOptions{ClusterID: n.cfg.ClusterID, Self: n.cfg.ID, RaftAddr: self,
		Key: n.cfg.ClusterKey, Peers: allow, Netns: -1, Detect: et, DetectJitter: et, AliveFor: et, Log: n.log})
	if err != nil {
		if mode == OffloadAuto {
			n.log.Warn("raft offload: off, the follower kernel path is not available here", "err", err)
			return nil
		}
		return fmt.Errorf("start follower offload: %w", err)
	}
	f.wakeups = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kedge", Subsystem: "raft",
		Name: "offload_wakeups_total", Help: "Leader-silent wake-ups from the kernel's failure detector by outcome (campaign, stale)."},
		[]string{"result"})
	n.reg.MustRegister(f.wakeups, &offloadCollector{k: f.k})
	n.fol = f
	return nil
}

// events is the failure detector's channel (nil without offload: never ready).
func (f *follower) events() <-chan offload.Event {
	if f == nil {
		return nil
	}
	return f.k.Events()
}

// tick feeds the kernel's heartbeat record into etcd-raft; called before each Tick.
func (n *Node) offloadTick(ctx context.Context) {
	f := n.fol
	if f == nil {
		return
	}
	hb, err := f.k.Heartbeat()
	if err != nil {
		n.log.Warn("raft offload: read heartbeat record", "err", err)
		return
	}
	if m := f.feed.next(hb, n.cfg.ID); m != nil && hb.Term >= n.termDurable {
		// (A record of an older term than the saved one: the node moved on since the
		// kernel answered; stepping it would only make etcd-raft answer a stale leader.)
		if err := n.rn.Step(ctx, m); err != nil && ctx.Err() == nil {
			n.log.Debug("raft offload: step synthesized heartbeat", "err", err)
		}
	}
}

// offloadAlive refreshes the alive deadline from the persist/apply loop: at most every quarter
// of the bound, so a busy loop does not make a system call per Ready.
func (n *Node) offloadAlive() {
	f := n.fol
	if f == nil {
		return
	}
	now := offload.Monotonic()
	if now-f.lastAlive < f.aliveFor/4 {
		return
	}
	if err := f.k.Alive(); err != nil {
		n.log.Warn("raft offload: refresh alive deadline", "err", err)
		return
	}
	f.lastAlive = now
}

// offloadMirror gives the kernel the durable term, its leader and the end of the durable log;
// called after the Ready's HardState and entries are saved, before its messages are sent.
func (n *Node) offloadMirror(term, lead uint64) {
	f := n.fol
	if f == nil {
		return
	}
	d := offload.Durable{Term: term, Leader: lead}
	if lead == n.cfg.ID {
		d.Leader = 0 // a leader receives no heartbeats
	} else if lead != 0 {
		d.LeaderAddr = f.peers[lead]
	}
	last, err := n.st.LastIndex()
	if err == nil {
		d.LastIndex = last
		d.LastTerm, err = n.st.Term(last)
	}
	if err != nil {
		n.log.Warn("raft offload: read the durable log's end", "err", err)
		return
	}
	if f.mirrored && f.mirror == d && f.lead == lead {
		return
	}
	if err := f.k.Mirror(d); err != nil {
		n.log.Warn("raft offload: mirror durable state", "err", err)
		return
	}
	f.mirror, f.lead, f.mirrored = d, lead, true
}

// onLeaderSilent handles a failure-detector wake-up: if the node still follows that leader in
// that term, nothing newer was answered in the kernel and user space heard nothing from the
// leader either, it starts a pre-vote now (PreVote is on: Campaign begins with one) instead of
// waiting for its own election timer.
func (n *Node) onLeaderSilent(ctx context.Context, ev offload.Event) {
	f := n.fol
	stale := func(why string) {
		f.wakeups.WithLabelValues("stale").Inc()
		n.log.Debug("raft offload: leader-silent event ignored", "why", why, "leader", ev.Leader, "term", ev.Term)
	}
	if n.leader.Load() != ev.Leader || f.mirror.Term != ev.Term {
		stale("leader or term changed")
		return
	}
	hb, err := f.k.Heartbeat()
	if err != nil || hb.Arrival != ev.LastArrival {
		stale("newer heartbeat")
		return
	}
	if t := n.tr.LastHeard(ev.Leader); !t.IsZero() && time.Since(t) < f.detect {
		stale("leader heard in user space")
		return
	}
	f.wakeups.WithLabelValues("campaign").Inc()
	n.log.Info("raft offload: leader silent, starting a pre-vote", "leader", ev.Leader, "term", ev.Term,
		"silent_for", ev.Fired-ev.LastArrival)
	if err := n.rn.Campaign(ctx); err != nil && ctx.Err() == nil {
		n.log.Warn("raft offload: campaign", "err", err)
	}
}

// dropSynthResps removes the answers to synthesized heartbeats from msgs (in place).
func dropSynthResps(msgs []*pb.Message) []*pb.Message {
	out := msgs[:0]
	for _, m := range msgs {
		if !isSynthResp(m) {
			out = append(out, m)
		}
	}
	return out
}

func (n *Node) closeOffload() error {
	if n.fol == nil {
		return nil
	}
	return n.fol.k.Close()
}

// OffloadMode describes the follower kernel path ("" when off).
func (n *Node) OffloadMode() string {
	if n.fol == nil {
		return ""
	}
	return n.fol.k.Mode() + " on " + n.fol.k.Interface()
}

// offloadCollector exports the program's counters as kedge_raft_offload_packets_total{counter}.
type offloadCollector struct{ k *offload.Follower }

var offloadDesc = prometheus.NewDesc("kedge_raft_offload_packets_total",
	"Follower XDP program counters (docs/raft.md \"Kernel paths: follower\").", []string{"counter"}, nil)

func (c *offloadCollector) Describe(ch chan<- *prometheus.Desc) { ch <- offloadDesc }

func (c *offloadCollector) Collect(ch chan<- prometheus.Metric) {
	cs, err := c.k.Stats()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(offloadDesc, err)
		return
	}
	for _, s := range cs {
		ch <- prometheus.MustNewConstMetric(offloadDesc, prometheus.CounterValue, float64(s.Value), s.Name)
	}
}
