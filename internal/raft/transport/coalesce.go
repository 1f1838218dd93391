package transport

import (
	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/kedge-dev/kedge/internal/raft/wire"
)

// coalesceMax bounds the entry bytes of one merged append: half the bulk frame limit,
// leaving the other half for the entries' own encoding (index, term, type per entry). An
// append already larger (max_append_bytes is at most 4 MiB) is sent as it is.
const coalesceMax = wire.BulkMax / 2

// coalesce folds, per peer, the appends and append acknowledgements of one batch of
// messages (one Send call, so one Ready's) into as few as say the same (docs/raft.md
// section 3, "Coalescing"). etcd-raft emits an append per follower for every proposal it
// steps and for every advance of the commit index, and a follower acknowledges each one,
// so a Ready of a loaded leader holds several appends to each follower and a follower's
// Ready several acknowledgements to its leader; every one costs a system call and a Step
// on both sides.
//
//   - Appends (MsgApp) of the same term to the same peer whose entries continue each other
//     (the next one's Index and LogTerm are the last entry of the one before) become one
//     append of all their entries and the last one's commit index: what the follower does
//     with it is what it does with the run in order. The leader's records (Next, the
//     in-flight window, the commit it sent) moved with each append when etcd-raft emitted
//     it, and one acknowledgement of the last index frees every in-flight append below it.
//   - Proposals a follower forwards to its leader (MsgProp) become one proposal of all
//     their entries in order: the leader appends a proposal's entries together, and drops
//     a proposal (no leader, a transfer under way) under conditions that are the same for
//     each one of the batch. Proposals carry no term and vouch for nothing.
//   - Accepting acknowledgements (MsgAppResp without Reject) of the same term to the same
//     peer become the one with the highest index: each says "my log matches yours up to
//     Index", and the leader's handling (Match, in-flight window, commit) only moves
//     forward, so the highest one does all the others do. A Ready's messages go only after
//     its save, so that index is durable. Rejections are never folded, nor folded across.
//
// Heartbeats and their responses (UDP packets, unordered against the appends' TCP frames
// already) do not break a run; any other message to the peer does. The messages etcd-raft
// gave are not modified: a merged append is a new message.
func coalesce(msgs []*pb.Message) (out []*pb.Message, folded int) {
	if len(msgs) < 2 {
		return msgs, 0
	}
	type run struct {
		at    int // index in out of the run's message
		bytes int // entry bytes of a merged append
	}
	runs := map[uint64]run{} // by peer: the open run
	out = make([]*pb.Message, 0, len(msgs))
	for _, m := range msgs {
		to := m.GetTo()
		r, open := runs[to]
		if open {
			prev := out[r.at]
			switch {
			case canMergeApp(prev, m, r.bytes) || canMergeProps(prev, m, r.bytes):
				out[r.at] = mergeEntries(prev, m)
				runs[to] = run{r.at, r.bytes + entryBytes(m.GetEntries())}
				folded++
				continue
			case isAccept(prev) && isAccept(m) && prev.GetTerm() == m.GetTerm() && prev.GetFrom() == m.GetFrom():
				if m.GetIndex() > prev.GetIndex() {
					out[r.at] = m
				}
				folded++
				continue
			}
		}
		switch m.GetType() {
		case pb.MsgHeartbeat, pb.MsgHeartbeatResp:
			// Neither opens nor breaks a run.
		case pb.MsgApp, pb.MsgProp:
			runs[to] = run{len(out), entryBytes(m.GetEntries())}
		default:
			if isAccept(m) {
				runs[to] = run{at: len(out)}
			} else {
				delete(runs, to)
			}
		}
		out = append(out, m)
	}
	return out, folded
}

func isAccept(m *pb.Message) bool { return m.GetType() == pb.MsgAppResp && !m.GetReject() }

// canMergeApp reports whether next continues the append prev (whose merged entries hold
// bytes) within the size bound.
func canMergeApp(prev, next *pb.Message, bytes int) bool {
	if prev.GetType() != pb.MsgApp || next.GetType() != pb.MsgApp || prev.GetTerm() != next.GetTerm() ||
		prev.GetFrom() != next.GetFrom() || prev.GetSnapshot() != nil || next.GetSnapshot() != nil ||
		!onlyAppendFields(prev) || !onlyAppendFields(next) {
		return false
	}
	lastIndex, lastTerm := prev.GetIndex(), prev.GetLogTerm()
	if ents := prev.GetEntries(); len(ents) > 0 {
		lastIndex, lastTerm = ents[len(ents)-1].GetIndex(), ents[len(ents)-1].GetTerm()
	}
	return next.GetIndex() == lastIndex && next.GetLogTerm() == lastTerm &&
		(len(next.GetEntries()) == 0 || bytes+entryBytes(next.GetEntries()) <= coalesceMax)
}

// canMergeProps reports whether the proposals prev (whose merged entries hold bytes) and
// next can go as one within the size bound.
func canMergeProps(prev, next *pb.Message, bytes int) bool {
	return prev.GetType() == pb.MsgProp && next.GetType() == pb.MsgProp && prev.GetFrom() == next.GetFrom() &&
		prev.GetTerm() == next.GetTerm() && prev.GetIndex() == 0 && next.GetIndex() == 0 &&
		prev.GetLogTerm() == 0 && next.GetLogTerm() == 0 && prev.GetCommit() == 0 && next.GetCommit() == 0 &&
		prev.GetSnapshot() == nil && next.GetSnapshot() == nil && onlyAppendFields(prev) && onlyAppendFields(next) &&
		bytes+entryBytes(next.GetEntries()) <= coalesceMax
}

// onlyAppendFields reports whether m sets no field beyond those mergeEntries carries over.
func onlyAppendFields(m *pb.Message) bool {
	return len(m.GetContext()) == 0 && m.GetVote() == 0 && !m.GetReject() && m.GetRejectHint() == 0 &&
		len(m.GetResponses()) == 0
}

// mergeEntries is prev followed by next (appends that continue each other, or proposals)
// as one new message: prev's fields, both messages' entries, and an append's last commit.
func mergeEntries(prev, next *pb.Message) *pb.Message {
	ents := make([]*pb.Entry, 0, len(prev.GetEntries())+len(next.GetEntries()))
	ents = append(append(ents, prev.GetEntries()...), next.GetEntries()...)
	m := &pb.Message{Type: prev.Type, From: prev.From, To: prev.To, Term: prev.Term, LogTerm: prev.LogTerm,
		Index: prev.Index, Commit: prev.Commit, Entries: ents}
	if next.GetCommit() > prev.GetCommit() {
		m.Commit = next.Commit
	}
	return m
}

func entryBytes(ents []*pb.Entry) int {
	n := 0
	for _, e := range ents {
		n += len(e.GetData())
	}
	return n
}
