package kernelpaths

import (
	"net/netip"
	"testing"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/raft/offload"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// CheckQuorum under starvation (offloadAcks): a leader whose followers answer its heartbeats
// in time, but whose transport does not deliver the answers to etcd-raft (its receiving
// goroutine waits for a CPU while the Ready loop ticks), steps down after an election
// timeout - the false elections under stress in docs/raft.md section 12. Fed from the
// kernel's record of the answers (the real program, BPF_PROG_TEST_RUN) it stays leader; with
// nobody answering it still steps down.
func TestOffloadLeaderAcks(t *testing.T) {
	run := func(t *testing.T, answer, feed bool) raft.StateType {
		k := loadEqProgram(t)
		n := newEqNode(t, nil)
		// Node 2 wins an election: pre-votes and votes from node 1.
		if err := n.rn.Campaign(); err != nil {
			t.Fatal(err)
		}
		persist(t, n)
		for _, typ := range []pb.MessageType{pb.MsgPreVoteResp, pb.MsgVoteResp} {
			term := n.rn.BasicStatus().GetTerm()
			if typ == pb.MsgPreVoteResp {
				term++
			}
			if err := n.rn.Step(&pb.Message{Type: typ.Enum(), From: proto.Uint64(eqLeader), To: proto.Uint64(eqSelf), Term: proto.Uint64(term)}); err != nil {
				t.Fatal(err)
			}
			persist(t, n)
		}
		st := n.rn.BasicStatus()
		if st.RaftState != raft.StateLeader {
			t.Fatalf("node %d did not win: %+v", eqSelf, st)
		}
		term := st.GetTerm()
		if err := k.Mirror(offload.Durable{Term: term, Leader: eqSelf, LeaderAddr: eqSelfAddr, LastIndex: eqLast + 1, LastTerm: term}); err != nil {
			t.Fatal(err)
		}
		fed := map[uint64]uint64{}
		for i := 0; i < 3*eqElection; i++ {
			if answer {
				// Node 1 answers every heartbeat: the kernel sees it, the transport does not
				// deliver it.
				in, err := eqFrame(eqLeaderAddr, &pb.Message{Type: pb.MsgHeartbeatResp.Enum(), From: proto.Uint64(eqLeader),
					To: proto.Uint64(eqSelf), Term: proto.Uint64(term)})
				if err != nil {
					t.Fatal(err)
				}
				if ret, _, err := k.Run(in); err != nil || ret != bpftest.XDPPass {
					t.Fatalf("program: verdict %d, err %v; want the response passed up", ret, err)
				}
			}
			if feed { // offloadAcks, the transport having delivered nothing (heard 0)
				for _, id := range []uint64{eqLeader, eqProber} {
					a, ok, err := k.Ack(id)
					if err != nil {
						t.Fatal(err)
					}
					if ackToStep(a, ok, term, fed[id], 0) {
						fed[id] = a.Count
						if err := n.rn.Step(&pb.Message{Type: pb.MsgHeartbeatResp.Enum(), From: proto.Uint64(id),
							To: proto.Uint64(eqSelf), Term: proto.Uint64(term)}); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			n.rn.Tick()
			persist(t, n)
			if s := n.rn.BasicStatus().RaftState; s != raft.StateLeader {
				return s
			}
		}
		return raft.StateLeader
	}
	if s := run(t, true, true); s != raft.StateLeader {
		t.Errorf("answers recorded in the kernel and fed: %v after %d election timeouts, want leader", s, 3)
	}
	if s := run(t, true, false); s == raft.StateLeader {
		t.Error("answers not delivered and not fed: still leader after 3 election timeouts (CheckQuorum should step it down; the test does not show the case)")
	}
	if s := run(t, false, true); s == raft.StateLeader {
		t.Error("nobody answered: still leader after 3 election timeouts")
	}
}

func TestAckToStep(t *testing.T) {
	a := offload.Ack{Term: 7, Arrival: 5000, Count: 3}
	for _, c := range []struct {
		name  string
		ok    bool
		term  uint64
		fed   uint64
		heard int64
		want  bool
	}{
		{"new, transport silent", true, 7, 2, 0, true},
		{"new, transport heard earlier", true, 7, 2, 4000, true},
		{"transport heard it already", true, 7, 2, 5000, false},
		{"already fed", true, 7, 3, 0, false},
		{"another term", true, 8, 2, 0, false},
		{"no record", false, 7, 2, 0, false},
	} {
		if got := ackToStep(a, c.ok, c.term, c.fed, c.heard); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// persist saves each Ready of n and drops the messages (a leader's appends do not fit the
// UDP packet eqNode.ready encodes them into).
func persist(t *testing.T, n *eqNode) {
	t.Helper()
	for n.rn.HasReady() {
		rd := n.rn.Ready()
		n.save(t, rd)
		n.rn.Advance(rd)
	}
}

// The durable-state mirror (offloadMirror) writes the growth of the log alone at a tick, not
// after every Ready, and never while the node leads; everything else at once.
func TestMirrorWrite(t *testing.T) {
	const self = 2
	fol := offload.Durable{Term: 3, Leader: 1, LeaderAddr: eqLeaderAddr, LastIndex: 40, LastTerm: 3, DetectAfter: 11e6}
	lead := offload.Durable{Term: 3, Leader: self, LeaderAddr: eqSelfAddr, LastIndex: 40, LastTerm: 3}
	with := func(d offload.Durable, f func(*offload.Durable)) offload.Durable { f(&d); return d }
	grow := func(d *offload.Durable) { d.LastIndex += 5 }
	for _, c := range []struct {
		name   string
		cur, d offload.Durable
		held   bool
		ready  bool // written at a Ready
		tick   bool // written at a tick
	}{
		{"first write", offload.Durable{}, fol, false, true, true},
		{"unchanged", fol, fol, true, false, false},
		{"follower: log grows", fol, with(fol, grow), true, false, true},
		{"leader: log grows", lead, with(lead, grow), true, false, false},
		{"follower: log shrinks", fol, with(fol, func(d *offload.Durable) { d.LastIndex-- }), true, true, true},
		{"leader: log shrinks", lead, with(lead, func(d *offload.Durable) { d.LastIndex-- }), true, true, true},
		{"last term", fol, with(fol, func(d *offload.Durable) { d.LastIndex++; d.LastTerm++ }), true, true, true},
		{"term", fol, with(fol, func(d *offload.Durable) { d.Term++; grow(d) }), true, true, true},
		{"leader changes", fol, with(fol, func(d *offload.Durable) { d.Leader = 3; grow(d) }), true, true, true},
		{"leader steps down", lead, with(fol, grow), true, true, true},
		{"becomes leader", fol, with(lead, grow), true, true, true},
		{"leader lost", fol, with(fol, func(d *offload.Durable) { d.Leader, d.LeaderAddr, d.DetectAfter = 0, netip.AddrPort{}, 0 }), true, true, true},
		{"detector timeout", fol, with(fol, func(d *offload.Durable) { d.DetectAfter++ }), true, true, true},
	} {
		if got := mirrorWrite(c.cur, c.d, c.held, false, self); got != c.ready {
			t.Errorf("%s: written at a Ready %v, want %v", c.name, got, c.ready)
		}
		if got := mirrorWrite(c.cur, c.d, c.held, true, self); got != c.tick {
			t.Errorf("%s: written at a tick %v, want %v", c.name, got, c.tick)
		}
	}
}

// The log end a Ready's mirror uses without reading the storage (follower.saved) is the
// storage's own after every save: appends, an empty Ready, a conflict that truncates, and a
// snapshot (after which the storage is read again).
func TestFollowerSavedTracksLogEnd(t *testing.T) {
	st := raft.NewMemoryStorage()
	f := &follower{endKnown: true}
	ents := func(from, to, term uint64) []*pb.Entry {
		var es []*pb.Entry
		for i := from; i <= to; i++ {
			es = append(es, &pb.Entry{Index: proto.Uint64(i), Term: proto.Uint64(term)})
		}
		return es
	}
	for _, c := range []struct {
		name string
		rd   raft.Ready
	}{
		{"append 1-5", raft.Ready{Entries: ents(1, 5, 1)}},
		{"no entries", raft.Ready{}},
		{"append 6-8 of a new term", raft.Ready{Entries: ents(6, 8, 2)}},
		{"conflict from 4, shorter", raft.Ready{Entries: ents(4, 5, 3)}},
		{"append 6", raft.Ready{Entries: ents(6, 6, 3)}},
	} {
		if err := st.Append(c.rd.Entries); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		f.saved(&c.rd)
		last, _ := st.LastIndex()
		term, _ := st.Term(last)
		if !f.endKnown || f.end != (logEnd{last, term}) {
			t.Errorf("%s: tracked end %+v (known %v), storage %d/%d", c.name, f.end, f.endKnown, last, term)
		}
	}
	snap := raft.Ready{Snapshot: &pb.Snapshot{Metadata: &pb.SnapshotMetadata{Index: proto.Uint64(20), Term: proto.Uint64(3)}}}
	f.saved(&snap)
	if f.endKnown {
		t.Error("after a snapshot the end is still taken as known: the next mirror must read the storage")
	}
	(*follower)(nil).saved(&snap) // offload off: nothing to track
}
