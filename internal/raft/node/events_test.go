package node

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/raft/api"
	"github.com/kedge-dev/kedge/internal/raft/offload"
)

// The election record and the leader long-poll (docs/raft.md section 12): a client asking
// the survivors for a leader after the old term is told the new one as soon as they know
// it, and the new leader's record has the election's steps in order, the voter's the vote.
func TestElectionRecord(t *testing.T) {
	c := newCluster(t, 3, nil)
	old := c.waitLeader()
	oldTerm := c.nodes[old].Status().Term
	var survivors []uint64
	for id := range c.nodes {
		if id != old {
			survivors = append(survivors, id)
		}
	}
	cl := c.client(survivors...)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	// Asked before the leader is gone: nobody knows a leader after oldTerm yet.
	found := make(chan api.Leader, 1)
	errc := make(chan error, 1)
	go func() {
		l, err := cl.LeaderAfter(ctx, oldTerm)
		errc <- err
		found <- l
	}()
	start := int64(offload.Monotonic())
	c.stop(old)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	l := <-found
	if l.Leader == old || l.Term <= oldTerm || l.Client != c.cfgs[l.Leader-1].Self().Client {
		t.Fatalf("leader after term %d: %+v (old leader %d)", oldTerm, l, old)
	}
	if _, err := cl.At(l.Client).Put(ctx, "k", "v"); err != nil {
		t.Fatalf("put to the new leader: %v", err)
	}
	// The new leader's record, in order; the first entry of its term commits (polled: the
	// record of the commit comes with a later Ready than the election).
	want := []string{api.EventPreCandidate, api.EventCandidate, api.EventLeader, api.EventCommitted}
	deadline := time.Now().Add(5 * time.Second)
	for {
		ev, err := cl.Events(ctx, l.Client, start)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		var last int64
		for _, e := range ev.Events {
			if e.AtNs < last || e.AtNs <= start || e.AtNs > ev.NowNs {
				t.Fatalf("event times out of order or range: %+v (since %d, now %d)", ev.Events, start, ev.NowNs)
			}
			last = e.AtNs
			// A pre-vote runs at the term before the one it leads to (more than one may
			// have: the record keeps each).
			pre := e.Kind == api.EventPreCandidate && e.Term == l.Term-1
			if (pre || e.Term == l.Term) && e.Kind != api.EventDetector && e.Kind != api.EventFollower &&
				(len(got) == 0 || got[len(got)-1] != e.Kind) {
				got = append(got, e.Kind)
			}
		}
		if len(got) >= len(want) && slices.Equal(got[len(got)-len(want):], want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("new leader's record in term %d: %v, want %v (all: %+v)", l.Term, got, want, ev.Events)
		}
		time.Sleep(10 * time.Millisecond) // polling the record
	}
	var voter uint64
	for _, id := range survivors {
		if id != l.Leader {
			voter = id
		}
	}
	ev, err := cl.Events(ctx, c.cfgs[voter-1].Self().Client, start)
	if err != nil {
		t.Fatal(err)
	}
	voted := false
	for _, e := range ev.Events {
		voted = voted || (e.Kind == api.EventVote && e.Term == l.Term && e.Peer == l.Leader)
	}
	if !voted {
		t.Errorf("voter %d's record has no vote for %d in term %d: %+v", voter, l.Leader, l.Term, ev.Events)
	}
	// A leader known in a term above after_term answers at once; bad parameters are refused.
	if l2, err := cl.At(l.Client).LeaderAfter(ctx, 0); err != nil || l2.Leader != l.Leader {
		t.Errorf("leader after term 0: %+v, %v", l2, err)
	}
	for _, q := range []string{"/v1/leader?after_term=x", "/v1/leader?wait=1h", "/v1/leader?wait=-1s", "/v1/events?since_ns=x"} {
		resp, err := http.Get("http://" + l.Client + q)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: HTTP %d, want 400", q, resp.StatusCode)
		}
	}
}

// The ring keeps the last eventCap events, oldest first, and filters by time.
func TestEventRing(t *testing.T) {
	var r eventRing
	for i := 1; i <= eventCap+10; i++ {
		r.add(api.Event{AtNs: int64(i), Kind: api.EventVote})
	}
	all := r.since(0)
	if len(all) != eventCap || all[0].AtNs != 11 || all[len(all)-1].AtNs != eventCap+10 {
		t.Fatalf("ring: %d events, first %d, last %d", len(all), all[0].AtNs, all[len(all)-1].AtNs)
	}
	if got := r.since(eventCap + 5); len(got) != 5 || got[0].AtNs != eventCap+6 {
		t.Fatalf("since %d: %+v", eventCap+5, got)
	}
}
