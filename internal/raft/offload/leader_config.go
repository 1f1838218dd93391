package offload

import (
	"time"

	"github.com/cilium/ebpf"
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

// TxSeq is the follower program's kernel-channel auth_seq counter (auth.h raft_tx_seq), for
// the node's other kernel sender (LeaderOptions.TxSeq): one sequence per node.
func (f *Follower) TxSeq() *ebpf.Map { return f.objs.RaftTxSeq }
