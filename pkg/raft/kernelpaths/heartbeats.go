package kernelpaths

import (
	"fmt"
	"time"

	"github.com/kedge-dev/kedge/internal/raft/offload"
	"github.com/kedge-dev/kedge/internal/raft/wire"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
)

// heartbeatSender sends the leader's heartbeats from the kernel while a lease holds
// (internal/raft/offload.Leader; docs/raft.md "Kernel paths: leader heartbeats"). The Ready
// loop renews it on every tick and after every Ready that changed the leadership, and asks it
// about each heartbeat etcd-raft hands out.
type heartbeatSender interface {
	// Update: this node's leadership (lead, term), commit index and, as leader, every
	// follower's Progress.Match. As leader the lease is renewed; otherwise dropped at once.
	Update(lead bool, term, committed uint64, match map[uint64]uint64)
	// Suppress reports whether the kernel sends the heartbeat to `to` in `term`, so that
	// user space does not send it as well.
	Suppress(to, term uint64) bool
}

func newHeartbeatCounter(reg prometheus.Registerer, on bool) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kedge", Subsystem: "raft",
		Name: "heartbeats_kernel_total", Help: "Heartbeats etcd-raft produced that the kernel sent instead of user space."})
	if on {
		reg.MustRegister(c)
	}
	return c
}

// startHeartbeats starts the kernel sender (Config.LeaderHeartbeats) after the follower
// path, whose kernel-channel auth_seq it shares (one counter per node: auth.h), in the
// caller's network namespace: the heartbeat interval is HeartbeatTicks * Tick, the source
// the node's own raft address, the followers every other peer.
func (o *Offload) startHeartbeats() error {
	if o.cfg.LeaderHeartbeats == Off {
		return nil
	}
	lo := offload.LeaderOptions{ClusterID: o.cfg.ClusterID, Self: o.self, Source: o.peers[o.self], Log: o.log,
		Interval: time.Duration(o.cfg.HeartbeatTicks) * o.cfg.Tick, Lease: o.cfg.HeartbeatLease, Key: (*wire.Key)(o.cfg.Key)}
	if lo.Lease == 0 {
		lo.Lease = time.Duration(o.bound.Load()) // adaptive (cpuwait.go): the floor until the first reading
	}
	lo.Pacer.Netns = -1
	for _, p := range o.cfg.Peers {
		if p.ID != o.self {
			lo.Followers = append(lo.Followers, offload.Target{ID: p.ID, Addr: p.Addr})
		}
	}
	if o.fol != nil {
		lo.TxSeq = o.fol.k.TxSeq()
	}
	l, err := offload.NewLeader(lo)
	if err != nil {
		if o.cfg.LeaderHeartbeats == Auto {
			o.log.Warn("raft: kernel heartbeats off, the sender is not available here (user space sends them)", "err", err)
			return nil
		}
		return fmt.Errorf("start kernel heartbeats: %w", err)
	}
	o.hbLeader, o.hb, o.hbLease = l, l, l
	o.reg.MustRegister(&senderCollector{l: l})
	return nil
}

// followerOnlyShort reports whether a node runs the follower path (its kernel failure
// detector) without kernel heartbeats at an election timeout et below offload.MinBound: the
// combination that deposes a leader whose user space is starved for longer than et (mode
// follower of bench raft: 12-24 leader changes per 20 s round of writes at 10 ms, docs/raft.md
// "The default, and what it costs").
func followerOnlyShort(follower, kernelHeartbeats bool, et time.Duration) bool {
	return follower && !kernelHeartbeats && et < offload.MinBound
}

// senderCollector exports the kernel sender's counters and its pacer's as
// kedge_raft_heartbeat_sender_total{counter} and kedge_raft_heartbeat_pacer_total{counter}
// (tick_passes + filler_passes: what the conveyor costs; docs/raft.md "Kernel paths:
// leader heartbeats").
type senderCollector struct{ l *offload.Leader }

var (
	senderDesc = prometheus.NewDesc("kedge_raft_heartbeat_sender_total",
		"Kernel heartbeat sender counters (bpf/raft/leader.bpf.c).", []string{"counter"}, nil)
	pacerDesc = prometheus.NewDesc("kedge_raft_heartbeat_pacer_total",
		"Counters of the pacer the kernel heartbeats ride (docs/pacer.md).", []string{"counter"}, nil)
)

func (c *senderCollector) Describe(ch chan<- *prometheus.Desc) { ch <- senderDesc; ch <- pacerDesc }

func (c *senderCollector) Collect(ch chan<- prometheus.Metric) {
	s, err := c.l.Stats()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(senderDesc, err)
		return
	}
	k := s.Counters
	for name, v := range map[string]uint64{"ticks": k.Ticks, "ticks_sent": k.TicksSent, "ticks_expired": k.TicksExpired,
		"ticks_owner_exiting": k.TicksOwnerExiting, "heartbeats": k.Heartbeats, "inactive": k.Inactive,
		"send_errors": k.SendErrors, "suppressed": s.Suppressed, "overdue": s.Overdue} {
		ch <- prometheus.MustNewConstMetric(senderDesc, prometheus.CounterValue, float64(v), name)
	}
	for name, v := range s.Pacer.Counters {
		ch <- prometheus.MustNewConstMetric(pacerDesc, prometheus.CounterValue, float64(v), name)
	}
}

func (o *Offload) closeHeartbeats() error {
	if o.hbLeader == nil {
		return nil
	}
	return o.hbLeader.Close()
}

// renewHeartbeats hands the offload this node's leadership and progress. Called only after
// the state it reports is durable (the term of a leader was persisted before it could
// campaign and win; commit needs no durability, and each follower's Commit is capped by its
// Match, entries it acknowledged as durable).
func (o *Offload) renewHeartbeats() {
	hb := o.hb
	if hb == nil {
		return
	}
	s := o.rn.Status()
	lead := s.RaftState == raft.StateLeader
	var match map[uint64]uint64
	if lead {
		match = make(map[uint64]uint64, len(s.Progress))
		for id, pr := range s.Progress {
			match[id] = pr.Match
		}
	}
	hb.Update(lead, s.GetTerm(), s.GetCommit(), match)
}

// kernelHeartbeats drops the heartbeats the kernel sends, in place (msgs is the Ready's, sent
// once: no allocation per Ready). A heartbeat with a context (a ReadIndex round: the follower
// echoes the context) always goes from user space.
func (o *Offload) kernelHeartbeats(msgs []*pb.Message) []*pb.Message {
	hb := o.hb
	if hb == nil {
		return msgs
	}
	out := msgs[:0]
	for _, m := range msgs {
		if m.GetType() == pb.MsgHeartbeat && len(m.GetContext()) == 0 && hb.Suppress(m.GetTo(), m.GetTerm()) {
			o.hbKernel.Inc()
			continue
		}
		out = append(out, m)
	}
	return out
}
