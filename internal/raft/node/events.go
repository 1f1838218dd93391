package node

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/kedge-dev/kedge/internal/raft/api"
	"github.com/kedge-dev/kedge/pkg/raft/kernelpaths"
	"go.etcd.io/raft/v3"
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
		e.AtNs = int64(kernelpaths.Monotonic())
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
	writeJSON(w, http.StatusOK, api.Events{NowNs: int64(kernelpaths.Monotonic()), Events: n.events.since(since)})
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
