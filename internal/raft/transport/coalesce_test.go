package transport

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kedge-dev/kedge/internal/raft/rafttest"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
)

func ents(term uint64, from, to uint64) []*pb.Entry {
	var es []*pb.Entry
	for i := from; i <= to; i++ {
		es = append(es, &pb.Entry{Term: new(term), Index: new(i), Data: []byte(fmt.Sprintf("e%d", i))})
	}
	return es
}

func app(to, term, index, logTerm, commit uint64, es []*pb.Entry) *pb.Message {
	return &pb.Message{Type: pb.MsgApp.Enum(), From: new(uint64(1)), To: new(to), Term: new(term), Index: new(index),
		LogTerm: new(logTerm), Commit: new(commit), Entries: es}
}

func ack(from, term, index uint64, reject bool) *pb.Message {
	m := &pb.Message{Type: pb.MsgAppResp.Enum(), From: new(from), To: new(uint64(1)), Term: new(term), Index: new(index)}
	if reject {
		m.Reject, m.RejectHint = new(true), new(index-1)
	}
	return m
}

func prop(from uint64, data ...string) *pb.Message {
	m := &pb.Message{Type: pb.MsgProp.Enum(), From: new(from), To: new(uint64(1))}
	for _, d := range data {
		m.Entries = append(m.Entries, &pb.Entry{Data: []byte(d)})
	}
	return m
}

func other(typ pb.MessageType, to uint64) *pb.Message {
	return &pb.Message{Type: typ.Enum(), From: new(uint64(1)), To: new(to), Term: new(uint64(2))}
}

// describe is a message in a line: type, peer, index/logterm, entries, commit.
func describe(m *pb.Message) string {
	s := fmt.Sprintf("%v %d->%d t%d", m.GetType(), m.GetFrom(), m.GetTo(), m.GetTerm())
	switch m.GetType() {
	case pb.MsgApp:
		s += fmt.Sprintf(" at %d/%d", m.GetIndex(), m.GetLogTerm())
		if es := m.GetEntries(); len(es) > 0 {
			s += fmt.Sprintf(" +%d..%d", es[0].GetIndex(), es[len(es)-1].GetIndex())
		}
		s += fmt.Sprintf(" c%d", m.GetCommit())
	case pb.MsgProp, pb.MsgReadIndex:
		var d []string
		for _, e := range m.GetEntries() {
			d = append(d, string(e.GetData()))
		}
		s += " [" + strings.Join(d, " ") + "]"
	case pb.MsgAppResp:
		s += fmt.Sprintf(" %d", m.GetIndex())
		if m.GetReject() {
			s += " reject"
		}
	}
	return s
}

func describeAll(ms []*pb.Message) string {
	var b []string
	for _, m := range ms {
		b = append(b, describe(m))
	}
	return strings.Join(b, "; ")
}

func TestCoalesce(t *testing.T) {
	big := []*pb.Entry{{Term: new(uint64(2)), Index: new(uint64(6)), Data: make([]byte, coalesceMax/2+1)}}
	big2 := []*pb.Entry{{Term: new(uint64(2)), Index: new(uint64(7)), Data: make([]byte, coalesceMax/2+1)}}
	for _, tc := range []struct {
		name   string
		in     []*pb.Message
		want   string
		folded int
	}{
		{"a leader's Ready: per-proposal appends and a commit update to two followers",
			[]*pb.Message{app(2, 2, 5, 2, 5, ents(2, 6, 7)), app(3, 2, 5, 2, 5, ents(2, 6, 7)),
				app(2, 2, 7, 2, 6, ents(2, 8, 8)), app(3, 2, 7, 2, 6, ents(2, 8, 8)), app(2, 2, 8, 2, 8, nil)},
			"MsgApp 1->2 t2 at 5/2 +6..8 c8; MsgApp 1->3 t2 at 5/2 +6..8 c6", 3},
		{"an empty commit update before the next append",
			[]*pb.Message{app(2, 2, 5, 2, 5, nil), app(2, 2, 5, 2, 5, ents(2, 6, 6))},
			"MsgApp 1->2 t2 at 5/2 +6..6 c5", 1},
		{"a heartbeat between appends stays and does not break the run",
			[]*pb.Message{app(2, 2, 5, 2, 5, ents(2, 6, 6)), other(pb.MsgHeartbeat, 2), app(2, 2, 6, 2, 6, ents(2, 7, 7))},
			"MsgApp 1->2 t2 at 5/2 +6..7 c6; MsgHeartbeat 1->2 t2", 1},
		{"a gap is not merged",
			[]*pb.Message{app(2, 2, 5, 2, 5, ents(2, 6, 6)), app(2, 2, 7, 2, 5, ents(2, 8, 8))},
			"MsgApp 1->2 t2 at 5/2 +6..6 c5; MsgApp 1->2 t2 at 7/2 +8..8 c5", 0},
		{"a log term that does not continue is not merged",
			[]*pb.Message{app(2, 3, 5, 2, 5, ents(2, 6, 6)), app(2, 3, 6, 3, 5, ents(3, 7, 7))},
			"MsgApp 1->2 t3 at 5/2 +6..6 c5; MsgApp 1->2 t3 at 6/3 +7..7 c5", 0},
		{"different terms are not merged",
			[]*pb.Message{app(2, 2, 5, 2, 5, ents(2, 6, 6)), app(2, 3, 6, 2, 5, ents(3, 7, 7))},
			"MsgApp 1->2 t2 at 5/2 +6..6 c5; MsgApp 1->2 t3 at 6/2 +7..7 c5", 0},
		{"a snapshot between appends breaks the run",
			[]*pb.Message{app(2, 2, 5, 2, 5, ents(2, 6, 6)), other(pb.MsgSnap, 2), app(2, 2, 6, 2, 5, ents(2, 7, 7))},
			"MsgApp 1->2 t2 at 5/2 +6..6 c5; MsgSnap 1->2 t2; MsgApp 1->2 t2 at 6/2 +7..7 c5", 0},
		{"appends over the size bound stay apart",
			[]*pb.Message{app(2, 2, 5, 2, 5, big), app(2, 2, 6, 2, 5, big2)},
			"MsgApp 1->2 t2 at 5/2 +6..6 c5; MsgApp 1->2 t2 at 6/2 +7..7 c5", 0},
		{"a follower's acknowledgements: the highest index, a stale one folded too",
			[]*pb.Message{ack(2, 2, 5, false), ack(2, 2, 7, false), ack(2, 2, 6, false)},
			"MsgAppResp 2->1 t2 7", 2},
		{"a rejection is kept and not folded across",
			[]*pb.Message{ack(2, 2, 5, false), ack(2, 2, 9, true), ack(2, 2, 7, false), ack(2, 2, 8, false)},
			"MsgAppResp 2->1 t2 5; MsgAppResp 2->1 t2 9 reject; MsgAppResp 2->1 t2 8", 1},
		{"acknowledgements of different terms stay apart",
			[]*pb.Message{ack(2, 2, 5, false), ack(2, 3, 7, false)},
			"MsgAppResp 2->1 t2 5; MsgAppResp 2->1 t3 7", 0},
		{"a follower's forwarded proposals become one, a read request ends the run",
			[]*pb.Message{prop(2, "a"), prop(2, "b", "c"), other(pb.MsgHeartbeatResp, 1), prop(2, "d"),
				{Type: pb.MsgReadIndex.Enum(), From: new(uint64(2)), To: new(uint64(1)), Entries: []*pb.Entry{{Data: []byte("ctx")}}},
				prop(2, "e")},
			"MsgProp 2->1 t0 [a b c d]; MsgHeartbeatResp 1->1 t2; MsgReadIndex 2->1 t0 [ctx]; MsgProp 2->1 t0 [e]", 2},
		{"a vote response breaks the run",
			[]*pb.Message{ack(2, 2, 5, false), {Type: pb.MsgVoteResp.Enum(), From: new(uint64(2)), To: new(uint64(1)), Term: new(uint64(2))}, ack(2, 2, 7, false)},
			"MsgAppResp 2->1 t2 5; MsgVoteResp 2->1 t2; MsgAppResp 2->1 t2 7", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := describeAll(tc.in)
			out, folded := coalesce(tc.in)
			if got := describeAll(out); got != tc.want || folded != tc.folded {
				t.Errorf("coalesce(%s)\n got %s (folded %d)\nwant %s (folded %d)", before, got, folded, tc.want, tc.folded)
			}
			if after := describeAll(tc.in); after != before {
				t.Errorf("coalesce modified its input: %s became %s", before, after)
			}
		})
	}
}

// TestCoalesceEquivalent runs a 3-node etcd-raft cluster twice through the same schedule of
// proposals and deliveries (each node's Ready saved in a MemoryStorage before its messages
// go, messages delivered in order), once sending every Ready's messages as etcd-raft gave
// them and once coalesced: every node must end with the same log, HardState and, at the
// leader, the same view of its followers, and every node the same commit index and log
// length after every round - with fewer messages sent.
func TestCoalesceEquivalent(t *testing.T) {
	for seed := range uint64(20) {
		plain, nPlain := runCluster(t, seed, false)
		merged, nMerged := runCluster(t, seed, true)
		if strings.Contains(plain, "NOT ALL") {
			t.Fatalf("seed %d: the schedule left writes uncommitted: %s", seed, plain)
		}
		if plain != merged {
			t.Fatalf("seed %d: coalescing changed the outcome:\nplain:  %s\nmerged: %s", seed, plain, merged)
		}
		if nMerged >= nPlain {
			t.Errorf("seed %d: %d messages coalesced against %d plain: nothing folded", seed, nMerged, nPlain)
		}
		if seed == 0 {
			t.Logf("seed 0: %d messages plain, %d coalesced", nPlain, nMerged)
		}
	}
}

// runCluster elects node 1, then in rounds proposes a random number of entries at the
// leader and at the followers (which forward them) and lets every node handle one Ready; messages are delivered at the start of the
// next round, a random subset of nodes per round taking its turn. It returns the final
// state and the count of messages sent.
func runCluster(t *testing.T, seed uint64, merge bool) (string, int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	ids := []uint64{1, 2, 3}
	nodes := map[uint64]*raft.RawNode{}
	stores := map[uint64]*raft.MemoryStorage{}
	for _, id := range ids {
		st := raft.NewMemoryStorage()
		st.ApplySnapshot(&pb.Snapshot{Metadata: &pb.SnapshotMetadata{Index: new(uint64(1)), Term: new(uint64(1)),
			ConfState: &pb.ConfState{Voters: ids}}})
		rn, err := raft.NewRawNode(&raft.Config{ID: id, ElectionTick: 10, HeartbeatTick: 1, Storage: st,
			MaxSizePerMsg: 1 << 20, MaxInflightMsgs: 256, CheckQuorum: true, PreVote: true,
			Logger: rafttest.DiscardLogger{}})
		if err != nil {
			t.Fatal(err)
		}
		nodes[id], stores[id] = rn, st
	}
	var inbox []*pb.Message
	sent := 0
	handle := func(id uint64) {
		rn := nodes[id]
		if !rn.HasReady() {
			return
		}
		rd := rn.Ready()
		st := stores[id]
		if len(rd.Entries) > 0 {
			if err := st.Append(rd.Entries); err != nil {
				t.Fatal(err)
			}
		}
		if rd.HardState != nil && !raft.IsEmptyHardState(rd.HardState) {
			st.SetHardState(rd.HardState)
		}
		msgs := rd.Messages
		if merge {
			msgs, _ = coalesce(msgs)
		}
		sent += len(msgs)
		inbox = append(inbox, msgs...)
		rn.Advance(rd)
	}
	deliver := func() {
		msgs := inbox
		inbox = nil
		for _, m := range msgs {
			if err := nodes[m.GetTo()].Step(m); err != nil {
				t.Fatalf("step %s: %v", describe(m), err)
			}
		}
	}
	if err := nodes[1].Campaign(); err != nil {
		t.Fatal(err)
	}
	for range 20 { // the election
		for _, id := range ids {
			handle(id)
		}
		deliver()
	}
	if nodes[1].Status().RaftState != raft.StateLeader {
		t.Fatal("node 1 did not become leader")
	}
	next := 0
	var trace strings.Builder
	for round := range 60 {
		if round < 50 {
			for range rng.IntN(5) {
				nodes[1].Propose(fmt.Appendf(nil, "w%d", next))
				next++
			}
			for range rng.IntN(3) { // forwarded by a follower
				nodes[2+rng.Uint64N(2)].Propose(fmt.Appendf(nil, "f%d", next))
				next++
			}
		}
		for _, id := range ids {
			if round >= 50 || rng.IntN(3) > 0 { // a node that sits a round out gathers more
				handle(id)
			}
		}
		deliver()
		// The state after every round, not only the end: coalescing may not delay anything.
		for _, id := range ids {
			st := nodes[id].Status()
			last, _ := stores[id].LastIndex()
			fmt.Fprintf(&trace, "%d:%d/%d ", id, st.GetCommit(), last)
		}
	}
	for range 10 { // drain
		for _, id := range ids {
			handle(id)
		}
		deliver()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "rounds (node:commit/last) %s; ", trace.String())
	for _, id := range ids {
		st := stores[id]
		last, _ := st.LastIndex()
		es, _ := st.Entries(2, last+1, 1<<30)
		var data []string
		for _, e := range es {
			data = append(data, fmt.Sprintf("%d:%s", e.GetTerm(), e.GetData()))
		}
		hs, _, _ := st.InitialState()
		fmt.Fprintf(&b, "node %d: term %d commit %d log [%s]; ", id, hs.GetTerm(), hs.GetCommit(), strings.Join(data, " "))
	}
	s := nodes[1].Status()
	for _, id := range []uint64{2, 3} {
		pr := s.Progress[id]
		fmt.Fprintf(&b, "progress %d: match %d next %d %v; ", id, pr.Match, pr.Next, pr.State)
	}
	if s.GetCommit() != uint64(next)+2 {
		fmt.Fprintf(&b, "NOT ALL COMMITTED (commit %d, %d proposed)", s.GetCommit(), next)
	}
	return b.String(), sent
}
