package kernelpaths

import (
	"strconv"
	"time"

	"github.com/kedge-dev/kedge/internal/raft/offload"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
)

// heardNs is when the node last heard from leader (CLOCK_MONOTONIC ns; 0: never): with the
// follower path on, the leader's last word (follower.lastWord, the definition the program's
// pre-vote lease uses); without it, the last message its transport delivered from leader.
func (o *Offload) heardNs(leader uint64) int64 {
	if o.fol != nil {
		return o.fol.lastWord(leader)
	}
	if t := o.tr.LastHeard(leader); !t.IsZero() {
		return int64(offload.Monotonic() - time.Since(t))
	}
	return 0
}

// aliveBound is how long one pass of the persist/apply loop vouches for the node: its
// follower program answers for it that long after the loop's last refresh
// (Config.AliveBound, else the adaptive bound, cpuwait.go).
func (o *Offload) aliveBound() time.Duration {
	if o.cfg.AliveBound > 0 {
		return o.cfg.AliveBound
	}
	return time.Duration(o.bound.Load())
}

// slowSave records a save that held the loop longer than the alive bound (a stalled disk:
// the kernel stopped answering for the node meanwhile) and says so in the log, as etcd
// warns of a slow fdatasync.
func (o *Offload) slowSave(took time.Duration, entries int, bound time.Duration) {
	now := offload.Monotonic()
	o.event(Event{AtNs: int64(now - took), Kind: EventSlowSave, Term: o.termDurable,
		SaveNs: int64(took), BoundNs: int64(bound), Detail: strconv.Itoa(entries)})
	o.log.Warn("raft: saving a ready held the persist/apply loop longer than the alive bound (a slow disk): "+
		"the node stopped answering heartbeats for itself meanwhile", "took", took, "alive_bound", bound, "entries", entries)
}

// recordReady adds what a Ready says about the election to the record; called after the
// Ready was persisted, before its messages go out (a vote is then durable). saved is how
// long saving it took.
func (o *Offload) recordReady(rd *raft.Ready, prevLead uint64, saved time.Duration) {
	if ss := rd.SoftState; ss != nil && ss.RaftState != o.lastState {
		o.lastState = ss.RaftState
		term := o.termDurable
		switch ss.RaftState {
		case raft.StatePreCandidate:
			o.event(Event{Kind: EventPreCandidate, Term: term, Leader: prevLead, HeardNs: o.heardNs(prevLead)})
		case raft.StateCandidate:
			o.event(Event{Kind: EventCandidate, Term: term, SaveNs: int64(saved)})
		case raft.StateLeader:
			o.event(Event{Kind: EventLeader, Term: term, Leader: o.self})
			o.leaderTermStart = 0
		case raft.StateFollower:
			o.event(Event{Kind: EventFollower, Term: term, Leader: ss.Lead})
		}
	} else if ss != nil && ss.Lead != prevLead && ss.RaftState == raft.StateFollower {
		o.event(Event{Kind: EventFollower, Term: o.termDurable, Leader: ss.Lead})
	}
	if o.lastState == raft.StateLeader {
		// The first entry of the leader's term (etcd-raft appends an empty one when it wins).
		for _, e := range rd.Entries {
			if o.leaderTermStart == 0 && e.GetTerm() == o.termDurable {
				o.leaderTermStart = e.GetIndex()
			}
		}
		if hs := rd.HardState; hs != nil && o.leaderTermStart != 0 && hs.GetCommit() >= o.leaderTermStart && o.committedTerm != o.termDurable {
			o.committedTerm = o.termDurable
			o.event(Event{Kind: EventCommitted, Term: o.termDurable, Leader: o.self,
				Detail: strconv.FormatUint(o.leaderTermStart, 10)})
		}
	}
	for _, m := range rd.Messages {
		if m.GetType() == pb.MsgVoteResp && !m.GetReject() {
			o.event(Event{Kind: EventVote, Term: m.GetTerm(), Peer: m.GetTo()})
		}
	}
}
