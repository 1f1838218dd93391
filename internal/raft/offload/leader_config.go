package offload

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/raft/config"
)

// MinBound is the shortest default of the kernel paths' two bounds: the leader's heartbeat
// lease and the follower program's alive bound (DefaultBound). Tied to a short election
// timeout (20 ms), both ran out whenever the node's process waited that long for a CPU - a
// leader's kernel stopped heartbeating, a follower's program stopped answering - and the
// kernel paths gave more false elections under CPU stress than user space, whose tick-counted
// timers stall with the process (docs/raft.md section 12).
const MinBound = 100 * time.Millisecond

// DefaultBound is the default lease and alive bound for election timeout et: et, at least
// MinBound.
func DefaultBound(et time.Duration) time.Duration { return max(et, MinBound) }

// LeaderFromConfig starts the kernel heartbeat sender of the node cfg describes, in the
// caller's network namespace: the heartbeat interval is heartbeat_ticks * tick, the lease
// lease (0: DefaultBound of the election timeout, election_ticks * tick), the source the node's own raft
// address, the followers every other peer.
// txSeq (nil: the sender's own) is the kernel channel's auth_seq counter of the node's
// other kernel sender (Follower.TxSeq).
func LeaderFromConfig(cfg *config.Config, lease time.Duration, txSeq *ebpf.Map, log *slog.Logger) (*Leader, error) {
	src, err := config.ResolveAddr(cfg.Self().Raft)
	if err != nil {
		return nil, fmt.Errorf("resolve own raft address: %w", err)
	}
	o := LeaderOptions{ClusterID: cfg.ClusterID, Self: cfg.ID, Source: src, Log: log,
		Interval: time.Duration(cfg.HeartbeatTicks) * cfg.Tick, Lease: lease, Key: cfg.ClusterKey, TxSeq: txSeq}
	if o.Lease == 0 {
		o.Lease = DefaultBound(time.Duration(cfg.ElectionTicks) * cfg.Tick)
	}
	o.Pacer.Netns = -1
	for _, p := range cfg.Peers {
		if p.ID == cfg.ID {
			continue
		}
		a, err := config.ResolveAddr(p.Raft)
		if err != nil {
			return nil, fmt.Errorf("resolve peer %d: %w", p.ID, err)
		}
		o.Followers = append(o.Followers, Target{ID: p.ID, Addr: a})
	}
	return NewLeader(o)
}

// TxSeq is the follower program's kernel-channel auth_seq counter (auth.h raft_tx_seq), for
// the node's other kernel sender (LeaderOptions.TxSeq): one sequence per node.
func (f *Follower) TxSeq() *ebpf.Map { return f.objs.RaftTxSeq }
