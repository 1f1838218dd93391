package node

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/kedge-dev/kedge/internal/raft/api"
	"github.com/kedge-dev/kedge/internal/raft/offload"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
)

// eventRing is the node's election record (GET /v1/events): the last eventCap events with
// CLOCK_MONOTONIC times, so that a harness can split a failover into its phases
// (docs/raft.md section 12). Written by the Ready loop, read by the HTTP handler.
const eventCap = 256

type eventRing struct {
	mu  sync.Mutex
	buf []api.Event // ring of eventCap
	n   int         // events ever added
}

func (r *eventRing) add(e api.Event) {
	if e.AtNs == 0 {
		e.AtNs = int64(offload.Monotonic())
	}
	r.mu.Lock()
	if len(r.buf) < eventCap {
		r.buf = append(r.buf, e)
	} else {
		r.buf[r.n%eventCap] = e
	}
	r.n++
	r.mu.Unlock()
}

// since returns the events after sinceNs, oldest first.
func (r *eventRing) since(sinceNs int64) []api.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []api.Event{}
	start := 0
	if r.n > eventCap {
		start = r.n % eventCap
	}
	for i := range len(r.buf) {
		if e := r.buf[(start+i)%len(r.buf)]; e.AtNs > sinceNs {
			out = append(out, e)
		}
	}
	return out
}

// leaderWatch wakes GET /v1/leader waiters when the leader or the term changes.
type leaderWatch struct {
	mu sync.Mutex
	ch chan struct{}
}

func (w *leaderWatch) wait() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	return w.ch
}

func (w *leaderWatch) changed() {
	w.mu.Lock()
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
	w.mu.Unlock()
}

// heardNs is when the node last heard from leader (CLOCK_MONOTONIC ns; 0: never): with the
// follower path on, the leader's last word (follower.lastWord, the definition the program's
// pre-vote lease uses); without it, the last message its transport delivered from leader.
func (n *Node) heardNs(leader uint64) int64 {
	if n.fol != nil {
		return n.fol.lastWord(leader)
	}
	if t := n.tr.LastHeard(leader); !t.IsZero() {
		return int64(offload.Monotonic() - time.Since(t))
	}
	return 0
}

// aliveBound is how long one pass of the persist/apply loop vouches for the node: its
// follower program answers for it that long after the loop's last refresh (Options.OffloadAlive,
// else offload.DefaultBound of the election timeout).
func (n *Node) aliveBound() time.Duration {
	if n.opts.OffloadAlive > 0 {
		return n.opts.OffloadAlive
	}
	return offload.DefaultBound(time.Duration(n.cfg.ElectionTicks) * n.cfg.Tick)
}

// slowSave records a save that held the loop longer than the alive bound (a stalled disk:
// the kernel stopped answering for the node meanwhile) and says so in the log, as etcd
// warns of a slow fdatasync.
func (n *Node) slowSave(took time.Duration, entries int) {
	now := offload.Monotonic()
	n.events.add(api.Event{AtNs: int64(now - took), Kind: api.EventSlowSave, Term: n.termDurable,
		SaveNs: int64(took), Detail: strconv.Itoa(entries)})
	n.log.Warn("raft: saving a ready held the persist/apply loop longer than the alive bound (a slow disk): "+
		"the node stopped answering heartbeats for itself meanwhile", "took", took, "alive_bound", n.aliveBound(), "entries", entries)
}

// recordReady adds what a Ready says about the election to the record; called by the Ready
// loop after the Ready was persisted, before its messages go out (a vote is then durable).
// saved is how long saving it took.
func (n *Node) recordReady(rd *raft.Ready, prevLead uint64, saved time.Duration) {
	if ss := rd.SoftState; ss != nil && ss.RaftState != n.lastState {
		n.lastState = ss.RaftState
		term := n.termDurable
		switch ss.RaftState {
		case raft.StatePreCandidate:
			n.events.add(api.Event{Kind: api.EventPreCandidate, Term: term, Leader: prevLead, HeardNs: n.heardNs(prevLead)})
		case raft.StateCandidate:
			n.events.add(api.Event{Kind: api.EventCandidate, Term: term, SaveNs: int64(saved)})
		case raft.StateLeader:
			n.events.add(api.Event{Kind: api.EventLeader, Term: term, Leader: n.cfg.ID})
			n.leaderTermStart = 0
		case raft.StateFollower:
			n.events.add(api.Event{Kind: api.EventFollower, Term: term, Leader: ss.Lead})
		}
	} else if ss != nil && ss.Lead != prevLead && ss.RaftState == raft.StateFollower {
		n.events.add(api.Event{Kind: api.EventFollower, Term: n.termDurable, Leader: ss.Lead})
	}
	if n.lastState == raft.StateLeader {
		// The first entry of the leader's term (etcd-raft appends an empty one when it wins).
		for _, e := range rd.Entries {
			if n.leaderTermStart == 0 && e.GetTerm() == n.termDurable {
				n.leaderTermStart = e.GetIndex()
			}
		}
		if hs := rd.HardState; hs != nil && n.leaderTermStart != 0 && hs.GetCommit() >= n.leaderTermStart && n.committedTerm != n.termDurable {
			n.committedTerm = n.termDurable
			n.events.add(api.Event{Kind: api.EventCommitted, Term: n.termDurable, Leader: n.cfg.ID,
				Detail: strconv.FormatUint(n.leaderTermStart, 10)})
		}
	}
	for _, m := range rd.Messages {
		if m.GetType() == pb.MsgVoteResp && !m.GetReject() {
			n.events.add(api.Event{Kind: api.EventVote, Term: m.GetTerm(), Peer: m.GetTo()})
		}
	}
}

func (n *Node) handleEvents(w http.ResponseWriter, r *http.Request) {
	var since int64
	if s := r.URL.Query().Get("since_ns"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			n.writeErr(w, http.StatusBadRequest, fmt.Errorf("since_ns %q: %w", s, err), "since_ns is CLOCK_MONOTONIC in ns", api.OutcomeNone)
			return
		}
		since = v
	}
	writeJSON(w, http.StatusOK, api.Events{NowNs: int64(offload.Monotonic()), Events: n.events.since(since)})
}

// maxLeaderWait bounds GET /v1/leader's wait.
const maxLeaderWait = 10 * time.Second

// handleLeader answers as soon as this node knows a leader in a term above after_term, or
// when wait has passed (a client finding the new leader after a failover asks every node at
// once: the first answer names it, no retry back-off).
func (n *Node) handleLeader(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var after uint64
	var wait time.Duration
	var err error
	if s := q.Get("after_term"); s != "" {
		if after, err = strconv.ParseUint(s, 10, 64); err != nil {
			n.writeErr(w, http.StatusBadRequest, fmt.Errorf("after_term %q: %w", s, err), "after_term is a raft term", api.OutcomeNone)
			return
		}
	}
	if s := q.Get("wait"); s != "" {
		if wait, err = time.ParseDuration(s); err != nil || wait < 0 || wait > maxLeaderWait {
			n.writeErr(w, http.StatusBadRequest, fmt.Errorf("wait %q: want a duration of 0-%v", s, maxLeaderWait), "e.g. wait=1s", api.OutcomeNone)
			return
		}
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		ch := n.leaderWatch.wait()
		s := n.rn.Status()
		res := api.Leader{ID: n.cfg.ID, Leader: s.Lead, Term: s.GetTerm()}
		if s.Lead != raft.None && s.GetTerm() > after {
			for _, p := range n.cfg.Peers {
				if p.ID == s.Lead {
					res.Client = p.Client
				}
			}
			writeJSON(w, http.StatusOK, res)
			return
		}
		select {
		case <-ch:
		case <-timer.C:
			writeJSON(w, http.StatusOK, res)
			return
		case <-r.Context().Done():
			return
		}
	}
}
