package kernelpaths

import (
	"context"
	"net/netip"
	"time"

	"github.com/kedge-dev/kedge/internal/raft/offload"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
)

// Leader failure: the kernel's detector wakes the node when the leader falls silent, and
// the voter's lease (the leader's last word, in real time) decides pre-votes and campaigns.

// Failure detector timing (docs/raft.md section 14): the first follower after the leader
// (ids in ascending order, wrapping) wakes detectMargin after the election timeout, the next
// one detectStagger(T) later, and so on. The margin covers the spread of one heartbeat's
// arrivals at the followers (the voter's lease, in XDP and in etcd-raft, must have run out
// when the pre-vote arrives); the stagger is more than a pre-vote and vote round with its
// fsyncs (2 ms was too short under load), so that two followers do not split the vote.
// etcd-raft's own randomized timer ([T, 2T) ticks) still runs behind it.
const detectMargin = time.Millisecond

func detectStagger(et time.Duration) time.Duration { return max(et/4, 5*time.Millisecond) }

// detectAfter is self's detector timeout while leader leads, et the election timeout.
func detectAfter(et time.Duration, self, leader uint64, peers map[uint64]netip.AddrPort) time.Duration {
	return et + detectMargin + time.Duration(detectRank(self, leader, peers))*detectStagger(et)
}

// onLeaderSilent handles a failure-detector wake-up: if the node still follows that leader in
// that term, nothing newer was answered in the kernel and user space heard nothing from the
// leader either, it starts a pre-vote now (PreVote is on: Campaign begins with one) instead of
// waiting for its own election timer.
func (o *Offload) onLeaderSilent(ctx context.Context, ev offload.Event) {
	f := o.fol
	stale := func(why string) {
		o.event(Event{AtNs: int64(ev.Fired), Kind: EventDetector, Term: ev.Term, Leader: ev.Leader,
			HeardNs: int64(ev.LastArrival), Detail: "stale: " + why})
		f.wakeups.WithLabelValues("stale").Inc()
		o.log.Debug("raft offload: leader-silent event ignored", "why", why, "leader", ev.Leader, "term", ev.Term)
	}
	// A pre-candidate of the same term is the node whose own etcd-raft timer fired first:
	// its ticks count the election timeout to within a tick, so its pre-vote may have gone
	// out before the voters' leases ran out (XDP's is exact: T after the last heartbeat) and
	// been ignored. The detector fires after the leases: ask again now rather than after
	// another randomized timeout.
	if !silenceCalls(ev, f.mirror.Term, o.lead.Load(), o.lastState) {
		stale("leader or term changed")
		return
	}
	hb, err := f.k.Heartbeat()
	if err != nil || hb.Arrival != ev.LastArrival {
		stale("newer heartbeat")
		return
	}
	// The checks above are the Ready loop's view, which lags etcd-raft's own: a vote request
	// the transport stepped meanwhile may have moved it on (it voted for another candidate in
	// a newer term). Campaigning then, from that newer term, deposed the candidate it had just
	// elected (a second election after a failover).
	if s := o.rn.Status(); !silenceCalls(ev, s.GetTerm(), s.Lead, s.RaftState) {
		stale("etcd-raft moved on")
		return
	}
	if w := f.lastWord(ev.Leader); w > 0 {
		// An append (TCP: the program does not see it) came after the last heartbeat:
		// look again when this node's slot after it has passed, as the kernel would have.
		since := offload.Monotonic() - time.Duration(w)
		if wait := slotWait(since, detectAfter(f.detect, o.self, ev.Leader, f.peers)); wait > 0 {
			stale("leader heard in user space")
			o.recheck(ev, wait)
			return
		}
	}
	o.event(Event{AtNs: int64(ev.Fired), Kind: EventDetector, Term: ev.Term, Leader: ev.Leader,
		HeardNs: int64(ev.LastArrival), Detail: DetailCampaign})
	f.wakeups.WithLabelValues(DetailCampaign).Inc()
	o.log.Info("raft offload: leader silent, starting a pre-vote", "leader", ev.Leader, "term", ev.Term,
		"silent_for", ev.Fired-ev.LastArrival)
	if err := o.rn.Campaign(ctx); err != nil && ctx.Err() == nil {
		o.log.Warn("raft offload: campaign", "err", err)
	}
}

// transportIn is what the transport steps received messages into: etcd-raft, with a vote
// request first judged against CheckQuorum's lease in real time (judgeLease).
type transportIn struct{ o *Offload }

func (t transportIn) Step(ctx context.Context, m *pb.Message) error {
	t.o.judgeLease(m)
	f := t.o.fol
	if f == nil || !resetsLease(m, f.k.Term()) {
		return t.o.rn.Step(ctx, m)
	}
	// The leader's last word, for the program's pre-vote lease (prevote.h) and the node's
	// judges (lastWord): stored before etcd-raft takes the message, so the kernel never
	// knows less than etcd-raft, and again after, so the kernel's lease runs at least the
	// election timeout from when etcd-raft restarted its own (Step may wait for the raft
	// goroutine). A receiving goroutine that is starved before it gets here makes the word
	// later than the arrival, never earlier: the kernel then refuses longer, not less.
	t.o.heard(f)
	err := t.o.rn.Step(ctx, m)
	t.o.heard(f)
	if err == nil {
		f.since.stepped(m.GetFrom(), m.GetTerm())
	}
	return err
}

// resetsLease reports whether etcd-raft's follower restarts its CheckQuorum lease on m
// (electionElapsed = 0: an append, heartbeat or snapshot from a leader, at its term or a
// newer one). term is the mirrored durable term: a message below it is one etcd-raft ignores
// (it answers a deposed leader with its newer term). The mirror may lag etcd-raft's term, so
// a message between the two counts although etcd-raft ignores it: the kernel refuses more,
// for at most one election timeout.
func resetsLease(m *pb.Message, term uint64) bool {
	switch m.GetType() {
	case pb.MsgApp, pb.MsgHeartbeat, pb.MsgSnap:
		return m.GetTerm() >= term
	}
	return false
}

// heard stores now as the leader's last word.
func (o *Offload) heard(f *follower) {
	if err := f.k.Heard(offload.Monotonic()); err != nil {
		o.log.Warn("raft offload: record the leader's last word", "err", err)
	}
}

// lastWord is when the node last heard from leader, in CLOCK_MONOTONIC ns (0: never): the
// later of the program's heartbeat record of leader and the last word user space stored
// (transportIn.Step). It is the one definition of "heard" behind every judge of the leader's
// silence - the program's pre-vote lease (prevote.h raft_pv_heard, the same maximum),
// judgeLease, the detector's second look (onLeaderSilent), holdEarlyPreVotes and the election
// record - so that none of them calls a leader silent that another still hears. The word is
// not tied to a leader (a message of a newer leader counts for the old one until the mirror
// moves): it can only make the judges see the leader as heard more recently.
func (f *follower) lastWord(leader uint64) int64 {
	w := int64(f.k.Word())
	if hb, err := f.k.Heartbeat(); err == nil && hb.Leader == leader && int64(hb.Arrival) > w {
		w = int64(hb.Arrival)
	}
	return w
}

func (t transportIn) ReportUnreachable(id uint64) { t.o.rn.ReportUnreachable(id) }

func (t transportIn) ReportSnapshot(id uint64, s raft.SnapshotStatus) { t.o.rn.ReportSnapshot(id, s) }

// judgeLease lets a vote request (MsgVote, or a MsgPreVote the program passed up) past
// etcd-raft's CheckQuorum lease when the lease is over in real time (forceIfLeaseOver); with
// the follower path only. Called from the transport's receivers.
func (o *Offload) judgeLease(m *pb.Message) {
	f := o.fol
	if f == nil || (m.GetType() != pb.MsgVote && m.GetType() != pb.MsgPreVote) {
		return
	}
	lead := o.lead.Load()
	if lead == 0 || lead == o.self {
		return
	}
	heard, now := o.heardNs(lead), offload.Monotonic()
	lease := f.detect
	if o.leaderGone(lead) != nil {
		lease = 0 // every connection with the leader closed since it was last heard (gone.go)
	}
	if !forceIfLeaseOver(m, lead, o.self, heard, now, lease) {
		return
	}
	f.leaseOver.Inc()
	o.event(Event{AtNs: int64(now), Kind: EventLease, Term: m.GetTerm(), Leader: lead, Peer: m.GetFrom(),
		HeardNs: heard, Detail: m.GetType().String()})
}

// campaignTransfer is etcd-raft's context of a vote request that skips the voter's lease
// (raft.campaignTransfer, unexported).
var campaignTransfer = []byte("CampaignTransfer")

// forceIfLeaseOver judges CheckQuorum's lease for a vote request m in real time and on the
// record the program judges pre-votes by (prevote.h): the lease of a follower of lead is
// over when lead's last heartbeat (heardNs, CLOCK_MONOTONIC: answered in the kernel or passed
// up to the transport) is an election timeout et or more before now. etcd-raft judges it in
// ticks (electionElapsed < electionTimeout), and its ticks run behind real time: Go's ticker
// drops the ticks that come while the Ready loop is busy (an fsync is longer than a 1 ms
// tick), and the kernel's heartbeats are stepped at the next tick after they arrive. It also
// restarts the count on an append (TCP), which the program does not see. Either way a voter
// whose kernel had granted a candidate's pre-vote then ignored the same candidate's real vote,
// and the failover waited for a second election (docs/raft.md section 14, "The voter's
// lease"). When the lease is over, m gets etcd-raft's transfer context, the one input that
// makes its Step skip the lease check (nothing else reads it for a vote request: the term,
// the log comparison and the durable vote are etcd-raft's as before), and it returns true.
// While the lease holds, m is left to etcd-raft, which ignores it unless its own count says
// the lease is over too. A request that already has a context (a leader transfer) is left
// as it is.
func forceIfLeaseOver(m *pb.Message, lead, self uint64, heardNs int64, now, et time.Duration) bool {
	if (m.GetType() != pb.MsgVote && m.GetType() != pb.MsgPreVote) || len(m.GetContext()) != 0 ||
		lead == 0 || lead == self || heardNs <= 0 || time.Duration(int64(now)-heardNs) < et {
		return false
	}
	m.Context = campaignTransfer
	return true
}

// slotWait is how long a node whose slot after the leader's last word is slot must still
// wait when that word is since old (<= 0: the slot has passed). The detector's campaign and
// holdEarlyPreVotes judge by the same slot: until session 7 the campaign looked at the
// election timeout instead, so an append between T and the slot before the detector's event
// made it campaign and holdEarlyPreVotes then dropped its pre-votes - the failover waited for
// etcd-raft's own timer or the next follower's slot (5 ms at a 10 ms timeout).
func slotWait(since, slot time.Duration) time.Duration { return slot - since }

// silenceCalls reports whether a leader-silent event still calls for a campaign in a node of
// term that follows lead in state: it follows the silent leader in the event's term, or it is
// a pre-candidate of that term (its own timer fired first, onLeaderSilent).
func silenceCalls(ev offload.Event, term, lead uint64, state raft.StateType) bool {
	return term == ev.Term && (lead == ev.Leader || (lead == 0 && state == raft.StatePreCandidate))
}

// holdEarlyPreVotes drops the pre-votes of a campaign etcd-raft's own timer started before
// this node's detector slot (detectAfter) after the last word from leader. Its ticks count
// the election timeout to within a tick and are randomized over [T, 2T): early, the voters'
// leases still hold and the pre-votes are ignored; later, they race the detector of the
// follower ranked before this one and split the vote. Held, the node waits as a
// pre-candidate (granting others' pre-votes) until its detector fires and onLeaderSilent
// campaigns again. Dropping a pre-vote is what a lossy network does: liveness only.
func (o *Offload) holdEarlyPreVotes(msgs []*pb.Message, prevLead uint64) []*pb.Message {
	f := o.fol
	if f == nil || prevLead == 0 || prevLead == o.self || o.lastState != raft.StatePreCandidate {
		return msgs
	}
	heard, now := o.heardNs(prevLead), offload.Monotonic()
	if heard == 0 || slotWait(time.Duration(int64(now)-heard), detectAfter(f.detect, o.self, prevLead, f.peers)) <= 0 {
		return msgs
	}
	// The leader's connections closed (gone.go): its slot after the close passed too.
	if g := o.leaderGone(prevLead); g != nil && !g.holdsBack(now) {
		return msgs
	}
	out := msgs[:0]
	held := 0
	for _, m := range msgs {
		if m.GetType() == pb.MsgPreVote {
			held++
			continue
		}
		out = append(out, m)
	}
	if held > 0 {
		f.wakeups.WithLabelValues("held").Inc()
		o.event(Event{Kind: EventDetector, Term: o.termDurable, Leader: prevLead, HeardNs: heard,
			Detail: "held: etcd-raft's timer fired before this node's detector slot"})
	}
	return out
}
