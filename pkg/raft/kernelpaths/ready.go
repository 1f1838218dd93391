package kernelpaths

import (
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
)

// leadsDurably says whether rd is a leader's whose term and vote are durable already: it
// was leader before rd and still is, rd changes no term or vote (a commit index only, which
// need not be durable before anything is sent) and holds no snapshot.
func (o *Offload) leadsDurably(rd *raft.Ready) bool {
	if o.lastState != raft.StateLeader || (rd.SoftState != nil && rd.SoftState.RaftState != raft.StateLeader) || !raft.IsEmptySnap(rd.Snapshot) {
		return false
	}
	hs := rd.HardState
	return hs == nil || (hs.GetTerm() == o.termDurable && hs.GetVote() == o.voteDurable)
}

// splitEarlySends splits a Ready's messages into those that may go before its save and the
// rest, which go after it. Early: a durable leader's appends and heartbeats (leading:
// etcd-raft's contract lets "Messages be sent while entries from the same batch are being
// persisted", and a leader's own copy counts towards the commit only when it steps its
// self-acknowledgement at Advance, after the save), and any node's forwarded proposals and
// read requests (MsgProp, MsgReadIndex: requests to the leader that carry no term and
// vouch for nothing this node stores).
func splitEarlySends(msgs []*pb.Message, leading bool) (early, later []*pb.Message) {
	for _, m := range msgs {
		switch m.GetType() {
		case pb.MsgProp, pb.MsgReadIndex:
			early = append(early, m)
		case pb.MsgApp, pb.MsgHeartbeat:
			if leading {
				early = append(early, m)
			} else {
				later = append(later, m)
			}
		default:
			later = append(later, m)
		}
	}
	return early, later
}
