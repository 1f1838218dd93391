package kernelpaths

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/kedge-dev/kedge/internal/raft/offload"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Each tick: the heartbeats the kernel answered are synthesized into etcd-raft (their
// responses dropped: the kernel sent them), and as leader the acknowledgements the kernel
// absorbed (the quorum wait) are stepped.

// synthContext marks the heartbeats the node synthesizes from the kernel's heartbeat record:
// etcd-raft echoes it in the MsgHeartbeatResp, which the node then does not send (the kernel
// already answered the real heartbeat). 12 bytes: never one of kedge's 8-byte read contexts.
var synthContext = []byte("kedge-xdp-hb")

// stepSince records, for the Ready loop, the leader and term of the last message that
// restarted etcd-raft's lease since the loop's last tick.
type stepSince struct {
	mu         sync.Mutex
	set        bool
	from, term uint64
}

func (s *stepSince) stepped(from, term uint64) {
	s.mu.Lock()
	s.set, s.from, s.term = true, from, term
	s.mu.Unlock()
}

// take returns what was recorded since the last take and clears it.
func (s *stepSince) take() (set bool, from, term uint64) {
	s.mu.Lock()
	set, from, term = s.set, s.from, s.term
	s.set = false
	s.mu.Unlock()
	return set, from, term
}

// skipSynth reports whether the synthesized heartbeat m (hbFeeder) may be left out: since
// the last tick the node stepped a message from m's leader at m's term that restarted
// etcd-raft's election timer (stepped: an append, heartbeat or snapshot - electionElapsed =
// 0 and lead = From, all the heartbeat would do to them), and m's commit is no higher than
// the commit already saved (commit: commitTo(m.Commit) is a no-op). The response etcd-raft
// would send is dropped anyway (the kernel's went out). Stepping m then changes nothing in
// etcd-raft, and leaving it out saves a Ready cycle per tick on a follower that appends
// reach anyway (docs/raft.md section 14, "The synthesized heartbeat").
func skipSynth(m *pb.Message, stepped bool, from, term, commit uint64) bool {
	return stepped && m.GetFrom() == from && m.GetTerm() == term && m.GetCommit() <= commit
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

// tick feeds the kernel's heartbeat record into etcd-raft; called before each Tick.
func (o *Offload) offloadTick(ctx context.Context) {
	f := o.fol
	if f == nil {
		return
	}
	stepped, from, term := f.since.take() // this tick's, whatever happens below
	hb, err := f.k.Heartbeat()
	if err != nil {
		o.log.Warn("raft offload: read heartbeat record", "err", err)
		return
	}
	if m := f.feed.next(hb, o.self); m != nil && hb.Term >= o.termDurable {
		// (A record of an older term than the saved one: the node moved on since the
		// kernel answered; stepping it would only make etcd-raft answer a stale leader.)
		if skipSynth(m, stepped, from, term, f.commit) {
			f.skipped.Inc()
			return
		}
		f.stepped.Inc()
		if err := o.rn.Step(ctx, m); err != nil && ctx.Err() == nil {
			o.log.Debug("raft offload: step synthesized heartbeat", "err", err)
		}
	}
}

// offloadAcks, as leader, steps a MsgHeartbeatResp for each follower whose response the
// kernel recorded (offload.Follower.Ack) but whose messages the transport has not delivered
// for ackAfter; called before each Tick. etcd-raft's CheckQuorum counts a follower active
// when a response reached Step within the election timeout, in ticks: under CPU starvation
// the transport's receiving goroutine waited for a CPU while the Ready loop kept ticking, and
// the leader stepped down although both followers had answered in time (section 14,
// "CheckQuorum under starvation"). The synthesized response says what the kernel saw - that
// follower answered a heartbeat of this term - without a context (it confirms no ReadIndex);
// etcd-raft marks the follower active and, if it is behind, sends it an append, as it does
// for the real response, which still comes later through the transport.
func (o *Offload) offloadAcks(ctx context.Context) {
	f := o.fol
	if f == nil || o.lastState != raft.StateLeader {
		return
	}
	for id := range f.peers {
		if id == o.self {
			continue
		}
		t := o.tr.LastHeard(id)
		if !t.IsZero() && time.Since(t) < f.ackAfter {
			continue // the transport keeps up with this follower: nothing to read
		}
		a, ok, err := f.k.Ack(id)
		if err != nil {
			o.log.Debug("raft offload: read follower ack", "peer", id, "err", err)
			continue
		}
		var heard int64
		if !t.IsZero() {
			heard = int64(offload.Monotonic() - time.Since(t))
		}
		if !ackToStep(a, ok, o.termDurable, f.acked[id], heard) {
			continue
		}
		f.acked[id] = a.Count
		m := &pb.Message{Type: pb.MsgHeartbeatResp.Enum(), From: proto.Uint64(id), To: proto.Uint64(o.self),
			Term: proto.Uint64(o.termDurable)}
		if err := o.rn.Step(ctx, m); err != nil && ctx.Err() == nil {
			o.log.Debug("raft offload: step recorded ack", "peer", id, "err", err)
			continue
		}
		f.ackFed.Inc()
	}
}

// offloadQuorum keeps the quorum wait's voters equal to etcd-raft's configuration and, as
// leader, steps for each voter whose responses the kernel absorbed since the last tick one
// MsgAppResp carrying the highest index it acknowledged: what stepping each absorbed response
// leaves (Progress.MaybeUpdate only moves forward; RecentActive is set), a tick later. The
// program absorbs only responses that move neither the commit index nor, at once, anything
// else etcd-raft needs (docs/raft.md section 16); called before
// each Tick, so CheckQuorum sees a follower active whose responses were all absorbed.
func (o *Offload) offloadQuorum(ctx context.Context) {
	f := o.fol
	if f == nil {
		return
	}
	cs := o.cs.Load()
	if cs != f.cs {
		var voters []uint64
		if !f.quorumOff {
			voters = quorumVoters(cs, o.self)
		}
		if err := f.k.SetVoters(voters); err != nil {
			o.log.Warn("raft offload: quorum wait voters", "err", err)
			return
		}
		f.cs, f.voters = cs, voters
		f.appTerm = 0 // the program's records start over
	}
	if len(f.voters) == 0 || o.lastState != raft.StateLeader {
		return
	}
	term, vs, err := f.k.Quorum()
	if err != nil {
		o.log.Debug("raft offload: read the quorum wait's records", "err", err)
		return
	}
	if term != o.termDurable {
		return // made at another term (or none yet): not this leader's acknowledgements
	}
	if term != f.appTerm {
		clear(f.appFed)
		f.appTerm = term
	}
	for _, v := range vs {
		if v.Absorbed == f.appFed[v.ID] {
			continue
		}
		m := &pb.Message{Type: pb.MsgAppResp.Enum(), From: proto.Uint64(v.ID), To: proto.Uint64(o.self),
			Term: proto.Uint64(term), Index: proto.Uint64(v.Index)}
		if err := o.rn.Step(ctx, m); err != nil && ctx.Err() == nil {
			o.log.Debug("raft offload: step the quorum wait's record", "peer", v.ID, "err", err)
			continue
		}
		f.appFed[v.ID] = v.Absorbed
		f.appFedC.Inc()
	}
}

// quorumVoters are the voters of cs other than self, in order, for the quorum wait: none
// (the wait off) in a joint configuration, whose commit needs two majorities, or when self
// is not a voter (its own acknowledgement is what the program counts on), or with more than
// the program tracks.
func quorumVoters(cs *pb.ConfState, self uint64) []uint64 {
	if len(cs.GetVotersOutgoing()) > 0 || !slices.Contains(cs.GetVoters(), self) {
		return nil
	}
	var vs []uint64
	for _, id := range cs.GetVoters() {
		if id != self {
			vs = append(vs, id)
		}
	}
	if len(vs) > offload.MaxVoters {
		return nil
	}
	slices.Sort(vs)
	return vs
}

// ackToStep reports whether a leader of term steps the kernel's record a of a follower's
// heartbeat responses: one was recorded (ok) at this term, since the count fed last (fed),
// and after the last message the transport delivered from that follower (heardNs,
// CLOCK_MONOTONIC ns; 0: none).
func ackToStep(a offload.Ack, ok bool, term, fed uint64, heardNs int64) bool {
	return ok && a.Term == term && a.Count != fed && int64(a.Arrival) > heardNs
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
