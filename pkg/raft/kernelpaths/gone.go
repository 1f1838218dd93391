package kernelpaths

import (
	"context"
	"net/netip"
	"time"

	"github.com/kedge-dev/kedge/internal/raft/offload"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
)

// A leader whose connections all closed (docs/raft.md section 14, "A leader whose
// connections closed"): a killed process's sockets close within milliseconds (section 1), so
// a follower's transport sees every bulk connection with its leader end by the leader's close
// or reset (transport.Options.PeerClosed) long before the election timeout. The follower then
// treats the leader as gone - until it hears from it again: its lease is over for the
// pre-votes its kernel judges (the mirror names no leader) and for the vote requests user
// space judges (judgeLease), and it campaigns after a delay staggered by its rank among the
// survivors, as the detector's slots are, so that two survivors do not split the vote. A
// host that dies without closing its sockets (power, a partition) closes nothing: the
// detector's election timeout still applies.

// goneMargin is the first survivor's delay after the close: the other survivor must have
// seen the close too (the same FIN or RST reaches both within a fraction of it) and left its
// lease before the pre-vote arrives. goneRetry is when the first survivor asks again if its
// pre-vote found the other's lease still held (its close not yet handled): before the next
// survivor's slot (detectStagger, at least 5 ms).
const (
	goneMargin = time.Millisecond
	goneRetry  = 2 * time.Millisecond
	// goneRetries bounds the first survivor's asking again.
	goneRetries = 3
)

// gone is a leader whose connections all closed at (CLOCK_MONOTONIC) while this node
// followed it in term; from slot on the node may campaign (its rank's time after the close,
// or at once after refusing a survivor whose log is behind). Written by the Ready loop, read
// by the transport's receivers too.
type gone struct {
	leader, term uint64
	at, slot     time.Duration
}

// holdsBack reports whether a campaign at now comes before the record's slot: etcd-raft's
// own randomized timer firing early, which would race the survivor ranked before this one
// and split the vote (holdEarlyPreVotes holds its pre-votes).
func (g *gone) holdsBack(now time.Duration) bool { return now < g.slot }

// holds reports whether g still calls leader gone: g is about leader, and nothing was heard
// from it (heardNs, the leader's last word) since its connections closed.
func (g *gone) holds(leader uint64, heardNs int64) bool {
	return g != nil && leader != 0 && g.leader == leader && heardNs < int64(g.at)
}

// detectRank is self's rank among the followers of leader: the followers before it going up
// from the leader's id and wrapping (unsigned), so the first after the leader is 0.
func detectRank(self, leader uint64, peers map[uint64]netip.AddrPort) int {
	rank := 0
	for id := range peers {
		if id != leader && id != self && id-leader-1 < self-leader-1 {
			rank++
		}
	}
	return rank
}

// goneAfter is how long after the close self campaigns: goneMargin plus its rank times the
// detector's stagger.
func goneAfter(et time.Duration, self, leader uint64, peers map[uint64]netip.AddrPort) time.Duration {
	return goneMargin + time.Duration(detectRank(self, leader, peers))*detectStagger(et)
}

// peerClosed is the transport's PeerClosed: it hands the close to the Ready loop (Wake).
func (o *Offload) peerClosed(id uint64) {
	if o.fol == nil || o.wake == nil || o.cfg.NoCloseFailover {
		return
	}
	w := Wakeup{gone: id, at: offload.Monotonic()}
	go func() {
		select {
		case o.wake <- w:
		case <-o.closed:
		}
	}()
}

// leaderGone is the record that holds for leader now (nil: none); Ready loop only for its
// clearing, any goroutine for reading.
func (o *Offload) leaderGone(leader uint64) *gone {
	f := o.fol
	if f == nil {
		return nil
	}
	g := f.gone.Load()
	if g == nil || g.leader != leader {
		return nil
	}
	if !g.holds(leader, o.heardNs(leader)) {
		return nil
	}
	return g
}

// clearGone drops a record that no longer holds: the leader spoke again, or the node moved
// on (another leader, another term). Ready loop.
func (o *Offload) clearGone(term, lead uint64) {
	f := o.fol
	g := f.gone.Load()
	if g == nil {
		return
	}
	heard := o.heardNs(g.leader)
	if g.term != term || (lead != 0 && lead != g.leader) || !g.holds(g.leader, heard) {
		if g.term == term && lead == g.leader {
			o.event(Event{Kind: EventDetector, Term: term, Leader: lead, HeardNs: heard, Detail: "gone: heard again"})
		}
		f.gone.Store(nil)
	}
}

// onLeaderGone handles the transport's report that every connection with a peer closed
// (w.campaign false) and the campaign it schedules (w.campaign true).
func (o *Offload) onLeaderGone(ctx context.Context, w Wakeup) {
	f := o.fol
	stale := func(why string) {
		f.wakeups.WithLabelValues("gone_stale").Inc()
		o.log.Info("raft offload: the leader's connections closed, no campaign", "why", why, "leader", w.gone)
		o.event(Event{Kind: EventDetector, Term: o.termDurable, Leader: w.gone, Detail: "gone, stale: " + why})
	}
	lead := o.lead.Load()
	if !w.campaign {
		if w.gone != lead || lead == o.self || o.lastState != raft.StateFollower {
			return // not this node's leader: nothing to do, nothing to record
		}
		heard := o.heardNs(lead)
		if heard >= int64(w.at) {
			stale("the leader was heard after its connections closed")
			return
		}
		after := goneAfter(f.detect, o.self, lead, f.peers)
		f.gone.Store(&gone{leader: lead, term: o.termDurable, at: w.at, slot: w.at + after})
		// The kernel passes the pre-votes of the next term up from now on (prevote.h
		// RAFT_PV_PASS_PENDING), where judgeLease finds the lease over and etcd-raft
		// decides by the log; a refusal there is seen (refusedBehind).
		o.offloadPending(o.termDurable + 1)
		o.event(Event{AtNs: int64(w.at), Kind: EventDetector, Term: o.termDurable, Leader: lead, HeardNs: heard,
			Detail: DetailGone + ", campaign in " + after.String()})
		o.log.Info("raft offload: every connection with the leader closed, campaigning", "leader", lead,
			"term", o.termDurable, "after", after)
		o.goneLater(w, after-(offload.Monotonic()-w.at))
		return
	}
	g := o.leaderGone(w.gone)
	if g == nil {
		if f.gone.Load() != nil {
			stale("the leader was heard again")
		}
		return
	}
	// etcd-raft's own view: still following the gone leader in its term, or a pre-candidate
	// of that term (this node's earlier pre-vote found no quorum yet).
	s := o.rn.Status()
	if s.GetTerm() != g.term || !(s.Lead == g.leader && s.RaftState == raft.StateFollower ||
		s.Lead == raft.None && s.RaftState == raft.StatePreCandidate) {
		return // an election is under way or over
	}
	f.wakeups.WithLabelValues("gone_campaign").Inc()
	o.event(Event{Kind: EventDetector, Term: g.term, Leader: g.leader, HeardNs: o.heardNs(g.leader),
		Detail: "gone: campaign"})
	if err := o.rn.Campaign(ctx); err != nil && ctx.Err() == nil {
		o.log.Warn("raft offload: campaign", "err", err)
	}
	if againBefore(offload.Monotonic()-g.at, w.retry, detectRank(o.self, g.leader, f.peers), detectStagger(f.detect)) {
		w.retry++
		o.goneLater(w, goneRetry)
	}
}

// againBefore reports whether a survivor of rank that campaigned since (after the close)
// and already asked again retries times asks once more goneRetry later: only the first
// survivor, at most goneRetries times, and only while that is still goneRetry before the
// next survivor's slot (goneMargin + stagger), so that the two never ask at once.
func againBefore(since time.Duration, retries, rank int, stagger time.Duration) bool {
	return rank == 0 && retries < goneRetries && since+2*goneRetry <= goneMargin+stagger
}

// refusedBehind looks at the messages of a Ready of a node whose leader is gone: a refused
// pre-vote (etcd-raft answers a pre-vote of a newer term with a refusal only when the
// candidate's log is behind its own) means this node's log is ahead of a survivor's, so the
// survivor cannot win and this one should ask now rather than at its slot: its pre-vote is
// granted by the survivor, a pre-candidate without a leader. Ready loop.
func (o *Offload) refusedBehind(msgs []*pb.Message) {
	f := o.fol
	if f == nil || f.gone.Load() == nil {
		return
	}
	lead := o.lead.Load()
	g := o.leaderGone(lead)
	if g == nil || o.lastState != raft.StateFollower {
		return
	}
	for _, m := range msgs {
		if m.GetType() == pb.MsgPreVoteResp && m.GetReject() {
			o.event(Event{Kind: EventDetector, Term: g.term, Leader: lead, Peer: m.GetTo(),
				Detail: "gone: refused a pre-vote of a candidate behind, campaign now"})
			o.log.Info("raft offload: refused the pre-vote of a survivor whose log is behind, campaigning now",
				"leader", lead, "candidate", m.GetTo())
			now := *g
			now.slot = offload.Monotonic()
			f.gone.Store(&now)
			o.goneLater(Wakeup{gone: lead, at: g.at, retry: goneRetries}, 0)
			return
		}
	}
}

// goneLater schedules w's campaign after d (Ready loop), replacing one pending.
func (o *Offload) goneLater(w Wakeup, d time.Duration) {
	f := o.fol
	w.campaign = true
	if f.goneTimer != nil {
		f.goneTimer.Stop()
	}
	f.goneTimer = time.AfterFunc(max(d, 0), func() {
		select {
		case o.wake <- w:
		case <-o.closed:
		}
	})
}
