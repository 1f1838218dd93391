package kernelpaths

import (
	"fmt"
	"io"
	"log"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/pktbuild"
	"github.com/kedge-dev/kedge/internal/raft/offload"
	"github.com/kedge-dev/kedge/internal/raft/wire"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// The equivalence of the follower kernel path (docs/raft.md "Kernel paths: follower"): two
// etcd-raft followers with the same log receive the same scripted stream of heartbeats. One
// ("off") steps every heartbeat as part 1's transport does. The other ("on") is fed as the
// node feeds it with offload: each heartbeat goes through the real XDP program
// (BPF_PROG_TEST_RUN); the ones it answers are not stepped, the node steps one synthesized
// heartbeat per tick from the program's record (hbFeeder), and the ones it passes up are
// stepped as they are. After every tick both must have the same term, vote, leader, state and
// commit, must have sent the same messages (the kernel's replies counting as the on-node's),
// and must answer a probing pre-vote the same way - which shows that their election timers
// (etcd-raft's electionElapsed, against the non-random electionTimeout) agree.

const (
	eqCluster  = 9
	eqSelf     = 2
	eqLeader   = 1
	eqProber   = 3
	eqElection = 10 // ElectionTick
	eqLast     = 40 // last log index
)

var (
	eqSelfAddr   = netip.MustParseAddrPort("10.9.0.2:7000")
	eqLeaderAddr = netip.MustParseAddrPort("10.9.0.1:7000")
	eqProbeAddr  = netip.MustParseAddrPort("10.9.0.3:7000")
)

type eqHeartbeat struct {
	term, commit uint64
	ctx          []byte
}

// eqNode is one follower: a RawNode over a MemoryStorage that persists each Ready.
type eqNode struct {
	rn   *raft.RawNode
	st   *raft.MemoryStorage
	k    *offload.Follower // nil: offload off
	feed hbFeeder
	sent []string // wire encodings of the messages sent since the last take
	lead uint64
	// As the node (offloadTick, transportIn.Step): what was stepped since the last tick, the
	// saved commit, and the synthesized heartbeats left out (skipSynth) or stepped.
	since          stepSince
	commit         uint64
	skipped, feeds int
}

func newEqNode(t *testing.T, k *offload.Follower) *eqNode {
	t.Helper()
	st := raft.NewMemoryStorage()
	if err := st.ApplySnapshot(&pb.Snapshot{Metadata: &pb.SnapshotMetadata{Index: proto.Uint64(1), Term: proto.Uint64(1),
		ConfState: &pb.ConfState{Voters: []uint64{1, 2, 3}}}}); err != nil {
		t.Fatal(err)
	}
	var ents []*pb.Entry
	for i := uint64(2); i <= eqLast; i++ {
		ents = append(ents, &pb.Entry{Index: proto.Uint64(i), Term: proto.Uint64(1)})
	}
	if err := st.Append(ents); err != nil {
		t.Fatal(err)
	}
	if err := st.SetHardState(&pb.HardState{Term: proto.Uint64(1), Commit: proto.Uint64(1)}); err != nil {
		t.Fatal(err)
	}
	rn, err := raft.NewRawNode(&raft.Config{ID: eqSelf, ElectionTick: eqElection, HeartbeatTick: 1, Storage: st,
		MaxSizePerMsg: 1 << 20, MaxInflightMsgs: 256, CheckQuorum: true, PreVote: true,
		Logger: &raft.DefaultLogger{Logger: log.New(io.Discard, "", 0)}})
	if err != nil {
		t.Fatal(err)
	}
	n := &eqNode{rn: rn, st: st, k: k}
	if k != nil {
		if err := k.Mirror(offload.Durable{Term: 1, LastIndex: eqLast, LastTerm: 1}); err != nil {
			t.Fatal(err)
		}
		if err := k.Alive(); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

func encodeMsg(t *testing.T, m *pb.Message) string {
	t.Helper()
	var b [wire.PktLen]byte
	p, err := wire.Encode(b[:], eqCluster, m)
	if err != nil {
		t.Fatalf("encode %v: %v", m, err)
	}
	return fmt.Sprintf("%x", p)
}

// loadEqProgram loads the follower program for node eqSelf, detached (BPF_PROG_TEST_RUN),
// or skips the test where the kernel cannot run it.
func loadEqProgram(t *testing.T) *offload.Follower {
	t.Helper()
	bpftest.RequireRoot(t)
	if err := offload.Probe(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	k, err := offload.LoadDetached(offload.FollowerOptions{ClusterID: eqCluster, Self: eqSelf, RaftAddr: eqSelfAddr,
		AliveFor: time.Hour, Peers: []wire.AuthPeer{{ID: eqLeader, Addr: eqLeaderAddr}, {ID: eqProber, Addr: eqProbeAddr}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

// save makes rd's state and entries durable in the node's storage.
func (n *eqNode) save(t *testing.T, rd raft.Ready) {
	t.Helper()
	if !raft.IsEmptyHardState(rd.HardState) {
		if err := n.st.SetHardState(rd.HardState); err != nil {
			t.Fatal(err)
		}
	}
	if len(rd.Entries) > 0 {
		if err := n.st.Append(rd.Entries); err != nil {
			t.Fatal(err)
		}
	}
}

// ready persists and "sends" what the node has, as handleReady does: save, mirror, send.
func (n *eqNode) ready(t *testing.T) {
	t.Helper()
	for n.rn.HasReady() {
		rd := n.rn.Ready()
		if rd.SoftState != nil {
			n.lead = rd.SoftState.Lead
		}
		n.save(t, rd)
		if !raft.IsEmptyHardState(rd.HardState) {
			n.commit = rd.HardState.GetCommit()
		}
		msgs := rd.Messages
		if n.k != nil {
			hs, _, _ := n.st.InitialState()
			lead := n.lead
			var addr netip.AddrPort
			if lead == eqLeader {
				addr = eqLeaderAddr
			} else {
				lead = 0
			}
			last, _ := n.st.LastIndex()
			lastTerm, _ := n.st.Term(last)
			if err := n.k.Mirror(offload.Durable{Term: hs.GetTerm(), Leader: lead, LeaderAddr: addr, LastIndex: last, LastTerm: lastTerm}); err != nil {
				t.Fatal(err)
			}
			msgs = dropSynthResps(msgs)
		}
		for _, m := range msgs {
			n.sent = append(n.sent, encodeMsg(t, m))
		}
		n.rn.Advance(rd)
	}
}

func eqFrame(src netip.AddrPort, m *pb.Message) ([]byte, error) {
	var b [wire.PktLen]byte
	p, err := wire.Encode(b[:], eqCluster, m)
	if err != nil {
		return nil, err
	}
	return pktbuild.New().IPv4(pktbuild.IPv4{Src: src.Addr(), Dst: eqSelfAddr.Addr()}).
		UDP(pktbuild.UDP{Src: src.Port(), Dst: eqSelfAddr.Port()}).Payload(p).Build(), nil
}

// receive delivers a heartbeat: stepped (off), or through the program first (on).
func (n *eqNode) receive(t *testing.T, h eqHeartbeat) {
	t.Helper()
	m := &pb.Message{Type: pb.MsgHeartbeat.Enum(), From: proto.Uint64(eqLeader), To: proto.Uint64(eqSelf),
		Term: proto.Uint64(h.term), Commit: proto.Uint64(h.commit), Context: h.ctx}
	if n.k != nil {
		in, err := eqFrame(eqLeaderAddr, m)
		if err != nil {
			t.Fatal(err)
		}
		ret, out, err := n.k.Run(in)
		if err != nil {
			t.Fatal(err)
		}
		if ret == bpftest.XDPTx {
			rm, reason := wire.Decode(out[len(out)-wire.PktLen:], eqCluster, eqLeader)
			if reason != wire.OK {
				t.Fatalf("the leader refuses the kernel's reply: %v", reason)
			}
			n.sent = append(n.sent, encodeMsg(t, rm))
			return
		}
		if ret != bpftest.XDPPass {
			t.Fatalf("program verdict %d for a heartbeat", ret)
		}
	}
	n.step(t, m)
}

// step steps a message that came up to user space, recording it as transportIn.Step does.
func (n *eqNode) step(t *testing.T, m *pb.Message) {
	t.Helper()
	if err := n.rn.Step(m); err != nil {
		t.Fatal(err)
	}
	if n.k != nil && resetsLease(m, n.k.Term()) {
		n.since.stepped(m.GetFrom(), m.GetTerm())
	}
	n.ready(t)
}

// appendMsg delivers an entry-less append from the leader (it goes up to user space in both
// modes): the log matches at eqLast, commit as given.
func (n *eqNode) appendMsg(t *testing.T, term, commit uint64) {
	t.Helper()
	n.step(t, &pb.Message{Type: pb.MsgApp.Enum(), From: proto.Uint64(eqLeader), To: proto.Uint64(eqSelf),
		Term: proto.Uint64(term), LogTerm: proto.Uint64(1), Index: proto.Uint64(eqLast), Commit: proto.Uint64(commit)})
}

func (n *eqNode) tick(t *testing.T) {
	t.Helper()
	if n.k != nil {
		hb, err := n.k.Heartbeat()
		if err != nil {
			t.Fatal(err)
		}
		stepped, from, term := n.since.take()
		if m := n.feed.next(hb, eqSelf); m != nil {
			if skipSynth(m, stepped, from, term, n.commit) {
				n.skipped++
			} else {
				n.feeds++
				if err := n.rn.Step(m); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	n.rn.Tick()
	n.ready(t)
}

// probe steps a pre-vote from node 3 for the next term with an up-to-date log: a follower
// in its leader's lease ignores it, otherwise it answers (grants). No state changes.
func (n *eqNode) probe(t *testing.T) {
	t.Helper()
	term := n.rn.BasicStatus().GetTerm() + 1
	if err := n.rn.Step(&pb.Message{Type: pb.MsgPreVote.Enum(), From: proto.Uint64(eqProber), To: proto.Uint64(eqSelf),
		Term: proto.Uint64(term), LogTerm: proto.Uint64(9), Index: proto.Uint64(eqLast)}); err != nil {
		t.Fatal(err)
	}
	n.ready(t)
}

func (n *eqNode) take() []string {
	s := slices.Clone(n.sent)
	slices.Sort(s)
	n.sent = nil
	return s
}

type eqState struct {
	Term, Vote, Lead, Commit uint64
	State                    string
}

func (n *eqNode) state() eqState {
	s := n.rn.BasicStatus()
	return eqState{Term: s.GetTerm(), Vote: s.GetVote(), Lead: s.Lead, Commit: s.GetCommit(), State: s.RaftState.String()}
}

func TestOffloadEquivalence(t *testing.T) {
	k := loadEqProgram(t)
	off, on := newEqNode(t, nil), newEqNode(t, k)

	// The script: heartbeats arriving before each tick.
	script := map[int][]eqHeartbeat{}
	commit := uint64(1)
	for i := 0; i < 30; i++ {
		switch {
		case i >= 12 && i < 12+eqElection-2: // a silence shorter than the election timeout
		case i%5 == 3: // two in one tick, commits out of order
			script[i] = []eqHeartbeat{{term: 1, commit: commit + 2}, {term: 1, commit: commit + 1}}
			commit += 2
		case i%7 == 0: // a ReadIndex context
			script[i] = []eqHeartbeat{{term: 1, commit: commit, ctx: []byte{byte(i), 1, 2, 3, 4, 5, 6, 7}}}
		default:
			commit++
			script[i] = []eqHeartbeat{{term: 1, commit: commit}}
		}
	}
	script[30] = []eqHeartbeat{{term: 2, commit: commit}} // a new term: passed to user space
	for i := 31; i < 45; i++ {
		commit++
		script[i] = []eqHeartbeat{{term: 2, commit: commit}}
	}
	script[33] = append(script[33], eqHeartbeat{term: 1, commit: 3}) // a stale one
	// Then two election timeouts of heartbeats that carry no new commit and no append: each
	// must still restart the on-node's timer (a skip rule that ignored whether an append came
	// since the tick would let its lease run out here).
	for i := 45; i < 45+2*eqElection; i++ {
		script[i] = []eqHeartbeat{{term: 2, commit: commit}}
	}
	const lastHB = 45 + 2*eqElection - 1
	// Appends (entry-less, as the leader sends a new commit) in some ticks, before or after
	// that tick's heartbeats, with the commit the leader had: the synthesized heartbeat of
	// such a tick is left out when its commit is no higher (skipSynth), stepped otherwise.
	type eqApp struct {
		after bool
		term  uint64
	}
	apps := map[int]eqApp{}
	for i := 0; i < 45; i++ {
		term := uint64(1)
		if i >= 30 {
			term = 2
		}
		switch {
		case i >= 12 && i < 12+eqElection-2:
		case i%4 == 1:
			apps[i] = eqApp{after: true, term: term}
		case i%6 == 2:
			apps[i] = eqApp{after: false, term: term}
		}
	}
	hbCommit := func(i int) uint64 { // the highest commit of the heartbeats up to tick i
		c := uint64(1)
		for j := 0; j <= i; j++ {
			for _, h := range script[j] {
				if h.term >= 1 && h.commit > c && !(j == 33 && h.term == 1) {
					c = h.commit
				}
			}
		}
		return c
	}

	answered := 0
	for i := 0; ; i++ {
		if a, ok := apps[i]; ok && !a.after {
			c := hbCommit(i - 1)
			off.appendMsg(t, a.term, c)
			on.appendMsg(t, a.term, c)
		}
		for _, h := range script[i] {
			before, _ := k.Heartbeat()
			off.receive(t, h)
			on.receive(t, h)
			if after, _ := k.Heartbeat(); after.Count > before.Count {
				answered++
			}
		}
		if a, ok := apps[i]; ok && a.after {
			c := hbCommit(i)
			off.appendMsg(t, a.term, c)
			on.appendMsg(t, a.term, c)
		}
		off.tick(t)
		on.tick(t)
		so, sn := off.state(), on.state()
		if so.State != "StateFollower" || sn.State != "StateFollower" {
			// The election timers are randomized per node from here: check the bound only.
			// The last heartbeat was stepped before tick lastHB, so tick lastHB+k leaves
			// electionElapsed = k+1, and the randomized timeout is at least eqElection.
			if i < lastHB+eqElection-1 {
				t.Fatalf("tick %d: an election after %d silent ticks (off %+v, on %+v)", i, i-lastHB, so, sn)
			}
			break
		}
		if so != sn {
			t.Fatalf("tick %d: state differs: off %+v, on %+v", i, so, sn)
		}
		off.probe(t)
		on.probe(t)
		if mo, mn := off.take(), on.take(); !slices.Equal(mo, mn) {
			t.Fatalf("tick %d: messages differ:\noff %v\non  %v", i, mo, mn)
		}
		if i > lastHB+2*eqElection+2 {
			t.Fatalf("tick %d: still followers %d ticks after the last heartbeat", i, i-lastHB)
		}
	}
	// Both campaign within [electionTimeout, 2*electionTimeout) ticks of silence.
	for _, n := range []*eqNode{off, on} {
		for i := 0; n.state().State == "StateFollower"; i++ {
			if i > 2*eqElection {
				t.Fatalf("a follower did not campaign within 2 election timeouts of silence: %+v", n.state())
			}
			n.tick(t)
		}
	}
	if answered < 30 {
		t.Errorf("the program answered only %d heartbeats of the script", answered)
	}
	if got := on.state(); got.Commit != commit {
		t.Errorf("commit %d after the script, want %d", got.Commit, commit)
	}
	if on.skipped == 0 || on.feeds == 0 {
		t.Errorf("synthesized heartbeats: %d left out, %d stepped - the script must exercise both", on.skipped, on.feeds)
	}
	t.Logf("equivalent over %d ticks; %d of the heartbeats answered in the kernel, the rest passed up; %d synthesized heartbeats stepped, %d left out after an append",
		lastHB+1, answered, on.feeds, on.skipped)
}

// The detector's order: the followers after the leader in ascending ids, wrapping, each one
// stagger later than the one before.
func TestDetectAfter(t *testing.T) {
	const et = 20 * time.Millisecond
	peers := map[uint64]netip.AddrPort{1: {}, 2: {}, 3: {}, 4: {}, 5: {}}
	st := detectStagger(et)
	for _, c := range []struct {
		self, leader uint64
		rank         int
	}{
		{2, 1, 0}, {3, 1, 1}, {5, 1, 3}, {4, 3, 0}, {5, 3, 1}, {1, 3, 2}, {2, 3, 3}, {1, 5, 0}, {4, 5, 3},
	} {
		if got, want := detectAfter(et, c.self, c.leader, peers), et+detectMargin+time.Duration(c.rank)*st; got != want {
			t.Errorf("self %d, leader %d: %v, want %v (rank %d)", c.self, c.leader, got, want, c.rank)
		}
		// A leader whose connections closed: the survivors campaign in the same order, the
		// first one goneMargin after the close.
		if got, want := goneAfter(et, c.self, c.leader, peers), goneMargin+time.Duration(c.rank)*st; got != want {
			t.Errorf("gone: self %d, leader %d: %v, want %v (rank %d)", c.self, c.leader, got, want, c.rank)
		}
	}
}
