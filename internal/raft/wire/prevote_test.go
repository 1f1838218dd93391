package wire

import (
	"encoding/binary"
	"io"
	"log"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/raft/wire/wiretest"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Pre-vote fixtures for bpf/raft/prevote.h: the voter is node 2 (testSelf) of {1, 2, 3},
// the candidate node 3, the leader (when there is one) node 1.

const (
	electionNS = 100 * time.Millisecond
	pvNow      = uint64(10 * time.Second)
	pvCand     = 3
)

type pvCase struct {
	name   string
	view   wiretest.AuthtestRaftPvView
	msg    *pb.Message
	action uint32                     // XDP action
	why    wiretest.AuthtestRaftPvWhy // RAFT_PV_WHY_MAX when auth refused it
	// oracle: compare with etcd-raft (only for cases etcd-raft and the kernel both answer)
	oracle bool
}

func baseView() wiretest.AuthtestRaftPvView {
	return wiretest.AuthtestRaftPvView{Self: testSelf, Term: 5, LastIndex: 10, LastTerm: 5, ElectionNs: uint64(electionNS),
		AliveUntilNs: pvNow + uint64(time.Second), NowNs: pvNow, Valid: 1}
}

func preVote(term, logTerm, index uint64) *pb.Message {
	return &pb.Message{Type: pb.MsgPreVote.Enum(), From: proto.Uint64(pvCand), To: proto.Uint64(testSelf),
		Term: proto.Uint64(term), LogTerm: proto.Uint64(logTerm), Index: proto.Uint64(index)}
}

const (
	xdpDrop = 1
	xdpPass = 2
	xdpTX   = 3
)

func pvCases() []pvCase {
	v := baseView
	with := func(f func(v *wiretest.AuthtestRaftPvView)) wiretest.AuthtestRaftPvView { x := v(); f(&x); return x }
	heardAgo := func(d time.Duration) wiretest.AuthtestRaftPvView {
		return with(func(x *wiretest.AuthtestRaftPvView) { x.Leader = 1; x.HeardNs = pvNow - uint64(d) })
	}
	vote := preVote(6, 5, 10)
	vote.Type = pb.MsgVote.Enum()
	withCtx := preVote(6, 5, 10)
	withCtx.Context = []byte("CampaignTransfer")
	stranger := preVote(6, 5, 10)
	stranger.From = proto.Uint64(9)
	return []pvCase{
		{"grant: same log", v(), preVote(6, 5, 10), xdpTX, wiretest.AuthtestRaftPvWhyRAFT_PV_GRANT, true},
		{"grant: longer log", v(), preVote(6, 5, 12), xdpTX, wiretest.AuthtestRaftPvWhyRAFT_PV_GRANT, true},
		{"grant: newer last term, shorter log", v(), preVote(7, 6, 3), xdpTX, wiretest.AuthtestRaftPvWhyRAFT_PV_GRANT, true},
		{"grant: leader silent past the election timeout", heardAgo(2 * electionNS), preVote(6, 5, 10), xdpTX, wiretest.AuthtestRaftPvWhyRAFT_PV_GRANT, true},
		{"reject: stale term", v(), preVote(4, 4, 10), xdpTX, wiretest.AuthtestRaftPvWhyRAFT_PV_REJECT_TERM, true},
		{"reject: log behind by index", v(), preVote(6, 5, 9), xdpTX, wiretest.AuthtestRaftPvWhyRAFT_PV_REJECT_LOG, true},
		{"reject: log behind by term", v(), preVote(6, 4, 100), xdpTX, wiretest.AuthtestRaftPvWhyRAFT_PV_REJECT_LOG, true},
		{"refuse: leader recently heard (ignored, as etcd-raft does)", heardAgo(electionNS / 10), preVote(6, 5, 10), xdpDrop, wiretest.AuthtestRaftPvWhyRAFT_PV_IGNORE_LEASE, true},
		{"refuse: leader recently heard, candidate's log ahead", heardAgo(electionNS - 1), preVote(9, 8, 50), xdpDrop, wiretest.AuthtestRaftPvWhyRAFT_PV_IGNORE_LEASE, true},
		// The leader's last word (follower_word): user space stepped an append or a heartbeat
		// the program did not see (TCP; passed up), and etcd-raft restarted its lease on it.
		{"refuse: heartbeat record stale, user space's last word fresh", with(func(x *wiretest.AuthtestRaftPvView) {
			x.Leader, x.HeardNs, x.WordNs = 1, pvNow-uint64(2*electionNS), pvNow-uint64(electionNS/10)
		}), preVote(6, 5, 10), xdpDrop, wiretest.AuthtestRaftPvWhyRAFT_PV_IGNORE_LEASE, true},
		{"grant: heartbeat record and last word both stale", with(func(x *wiretest.AuthtestRaftPvView) {
			x.Leader, x.HeardNs, x.WordNs = 1, pvNow-uint64(3*electionNS), pvNow-uint64(electionNS)
		}), preVote(6, 5, 10), xdpTX, wiretest.AuthtestRaftPvWhyRAFT_PV_GRANT, true},
		{"refuse: no heartbeat seen in XDP, last word fresh", with(func(x *wiretest.AuthtestRaftPvView) {
			x.Leader, x.WordNs = 1, pvNow-uint64(electionNS-1)
		}), preVote(6, 5, 10), xdpDrop, wiretest.AuthtestRaftPvWhyRAFT_PV_IGNORE_LEASE, true},
		{"refuse: last word stored after the program read its clock", with(func(x *wiretest.AuthtestRaftPvView) {
			x.Leader, x.HeardNs, x.WordNs = 1, pvNow-uint64(2*electionNS), pvNow+uint64(time.Millisecond)
		}), preVote(6, 5, 10), xdpDrop, wiretest.AuthtestRaftPvWhyRAFT_PV_IGNORE_LEASE, true},
		{"refuse: heartbeat recorded on another CPU after the program read its clock", with(func(x *wiretest.AuthtestRaftPvView) {
			x.Leader, x.HeardNs = 1, pvNow+1
		}), preVote(6, 5, 10), xdpDrop, wiretest.AuthtestRaftPvWhyRAFT_PV_IGNORE_LEASE, true},
		{"grant: no leader known, a last word does not matter", with(func(x *wiretest.AuthtestRaftPvView) {
			x.WordNs = pvNow - uint64(electionNS/10)
		}), preVote(6, 5, 10), xdpTX, wiretest.AuthtestRaftPvWhyRAFT_PV_GRANT, true},
		{"pass: leader known, never heard in XDP", with(func(x *wiretest.AuthtestRaftPvView) { x.Leader = 1 }), preVote(6, 5, 10), xdpPass, wiretest.AuthtestRaftPvWhyRAFT_PV_PASS_UNHEARD, false},
		{"pass: no mirrored state", with(func(x *wiretest.AuthtestRaftPvView) { x.Valid = 0 }), preVote(6, 5, 10), xdpPass, wiretest.AuthtestRaftPvWhyRAFT_PV_PASS_NO_STATE, false},
		{"pass: alive_until passed", with(func(x *wiretest.AuthtestRaftPvView) { x.AliveUntilNs = pvNow }), preVote(6, 5, 10), xdpPass, wiretest.AuthtestRaftPvWhyRAFT_PV_PASS_NOT_ALIVE, false},
		{"pass: this node leads", with(func(x *wiretest.AuthtestRaftPvView) { x.Leader = testSelf; x.HeardNs = 0 }), preVote(6, 5, 10), xdpPass, wiretest.AuthtestRaftPvWhyRAFT_PV_PASS_LEADER, false},
		{"pass: same term", v(), preVote(5, 5, 10), xdpPass, wiretest.AuthtestRaftPvWhyRAFT_PV_PASS_SAME_TERM, false},
		{"pass: the term the node is fsyncing", with(func(x *wiretest.AuthtestRaftPvView) { x.PendingTerm = 6 }), preVote(6, 5, 10), xdpPass, wiretest.AuthtestRaftPvWhyRAFT_PV_PASS_PENDING, false},
		{"grant: beyond the pending term", with(func(x *wiretest.AuthtestRaftPvView) { x.PendingTerm = 6 }), preVote(7, 5, 10), xdpTX, wiretest.AuthtestRaftPvWhyRAFT_PV_GRANT, true},
		{"pass: context", v(), withCtx, xdpPass, wiretest.AuthtestRaftPvWhyRAFT_PV_PASS_CONTEXT, false},
		{"pass: a real vote", v(), vote, xdpPass, wiretest.AuthtestRaftPvWhyRAFT_PV_PASS_TYPE, false},
		{"refuse: unknown peer (auth)", v(), stranger, xdpDrop, wiretest.AuthtestRaftPvWhyRAFT_PV_WHY_MAX, false},
	}
}

// TestKernelPreVote runs every rule through prevote_xdp (auth, decide, reply, sign) and checks
// the action, the reason, the answer's fields and its MAC (Go verifier, kernel channel); for
// the cases etcd-raft answers or ignores itself, it checks that etcd-raft, in the same state
// (term, last log entry, leader heard or not - by either record), does the same.
func TestKernelPreVote(t *testing.T) {
	bpftest.RequireRoot(t)
	o := loadAuthObjs(t, testSelf)
	fillAuth(t, o, &testKey)
	seq := uint64(1_700_000_000_000_000_000)
	var cases []bpftest.Case
	for _, c := range pvCases() {
		seq++
		cases = append(cases, bpftest.Case{
			Name: c.name,
			Setup: func(tb testing.TB) {
				if err := o.PvView.Update(uint32(0), &c.view, ebpf.UpdateAny); err != nil {
					tb.Fatal(err)
				}
			},
			In:      frame(signedAt(t, &testKey, c.msg, seq), peer3Addr),
			WantRet: c.action,
			Check:   func(tb testing.TB, res bpftest.Result) { checkPreVote(tb, o, c, res) },
		})
	}
	bpftest.Runner{Prog: o.PrevoteXdp}.Run(t, cases)
}

// checkPreVote checks what prevote_xdp did with c beyond its action: the reason, the
// answer's fields and its MAC, and etcd-raft's answer in the same state (c.oracle).
func checkPreVote(tb testing.TB, o *wiretest.AuthtestObjects, c pvCase, res bpftest.Result) {
	tb.Helper()
	var why wiretest.AuthtestRaftPvWhy
	if err := o.PvWhy.Lookup(uint32(0), &why); err != nil {
		tb.Fatal(err)
	}
	if res.Ret != c.action || why != c.why {
		tb.Errorf("why %v, want %v", why, c.why)
		return
	}
	var got *pb.Message
	if res.Ret == xdpTX {
		p := res.Out[len(res.Out)-PktLen:]
		// The answer goes back to the candidate: the test verifies it as node 3 would.
		r3 := &Receiver{Cluster: testCluster, Self: pvCand, Peers: map[uint64]netip.AddrPort{testSelf: peer1Addr}, Verifier: NewVerifier(&testKey)}
		m, reason := r3.Receive(p, peer1Addr)
		if reason != OK {
			tb.Errorf("the kernel's answer is refused by the candidate: %v", reason)
			return
		}
		if m.GetType() != pb.MsgPreVoteResp || m.GetFrom() != testSelf || m.GetTo() != pvCand {
			tb.Errorf("answer %v", m)
		}
		if seq := binary.BigEndian.Uint64(p[offAuthSeq:]); seq&SeqKernel == 0 {
			tb.Errorf("answer not signed on the kernel channel")
		}
		got = m
	}
	if !c.oracle {
		return
	}
	want := etcdAnswer(tb, c.view, c.msg)
	switch {
	case want == nil && got != nil:
		tb.Errorf("etcd-raft ignores it, the kernel answered %v", got)
	case want != nil && got == nil:
		tb.Errorf("etcd-raft answers %v, the kernel did not", want)
	case want != nil && (want.GetTerm() != got.GetTerm() || want.GetReject() != got.GetReject()):
		tb.Errorf("etcd-raft answers term %d reject %v, the kernel term %d reject %v",
			want.GetTerm(), want.GetReject(), got.GetTerm(), got.GetReject())
	}
}

// etcdAnswer puts an etcd-raft RawNode into the view's state - HardState.Term, a log whose
// last entry is (LastTerm, LastIndex), and, when the view has a leader, a heartbeat from it
// followed by as many ticks as the time since it was last heard (heartbeat record or last
// word) - steps m and returns the
// MsgPreVoteResp it sends (nil: it ignored m).
func etcdAnswer(t testing.TB, v wiretest.AuthtestRaftPvView, m *pb.Message) *pb.Message {
	t.Helper()
	ms := raft.NewMemoryStorage()
	if err := ms.ApplySnapshot(&pb.Snapshot{Metadata: &pb.SnapshotMetadata{Index: proto.Uint64(v.LastIndex),
		Term: proto.Uint64(v.LastTerm), ConfState: &pb.ConfState{Voters: []uint64{1, 2, 3}}}}); err != nil {
		t.Fatal(err)
	}
	if err := ms.SetHardState(&pb.HardState{Term: proto.Uint64(v.Term), Commit: proto.Uint64(v.LastIndex)}); err != nil {
		t.Fatal(err)
	}
	const ticks = 10
	tick := electionNS / ticks
	rn, err := raft.NewRawNode(&raft.Config{ID: testSelf, ElectionTick: ticks, HeartbeatTick: 1, Storage: ms,
		MaxSizePerMsg: 1 << 20, MaxInflightMsgs: 16, PreVote: true, CheckQuorum: true,
		Logger: &raft.DefaultLogger{Logger: log.New(io.Discard, "", 0)}})
	if err != nil {
		t.Fatal(err)
	}
	drain := func() []*pb.Message {
		var out []*pb.Message
		for rn.HasReady() {
			rd := rn.Ready()
			out = append(out, rd.Messages...)
			rn.Advance(rd)
		}
		return out
	}
	// The leader's last word, whichever record has it: etcd-raft restarts its lease on a
	// heartbeat and on an append alike.
	if heard := max(v.HeardNs, v.WordNs); v.Leader != 0 && heard != 0 {
		hb := &pb.Message{Type: pb.MsgHeartbeat.Enum(), From: proto.Uint64(v.Leader), To: proto.Uint64(testSelf),
			Term: proto.Uint64(v.Term), Commit: proto.Uint64(v.LastIndex)}
		if err := rn.Step(hb); err != nil {
			t.Fatal(err)
		}
		if v.NowNs > heard {
			for range int(time.Duration(v.NowNs-heard) / tick) {
				rn.Tick()
			}
		}
	}
	drain()
	if err := rn.Step(m); err != nil {
		t.Fatal(err)
	}
	for _, out := range drain() {
		if out.GetType() == pb.MsgPreVoteResp && out.GetTo() == m.GetFrom() {
			return out
		}
	}
	return nil
}

// TestEtcdOracle pins the oracle itself: etcd-raft ignores a pre-vote in lease, rejects a
// stale term with its own term, grants an up-to-date one with the candidate's term.
func TestEtcdOracle(t *testing.T) {
	lease := baseView()
	lease.Leader, lease.HeardNs = 1, pvNow-uint64(electionNS/10)
	if a := etcdAnswer(t, lease, preVote(6, 5, 10)); a != nil {
		t.Errorf("in lease: etcd-raft answered %v", a)
	}
	if a := etcdAnswer(t, baseView(), preVote(4, 4, 10)); a == nil || !a.GetReject() || a.GetTerm() != 5 {
		t.Errorf("stale term: %v", a)
	}
	if a := etcdAnswer(t, baseView(), preVote(6, 5, 9)); a == nil || !a.GetReject() || a.GetTerm() != 5 {
		t.Errorf("log behind: %v", a)
	}
	if a := etcdAnswer(t, baseView(), preVote(6, 5, 10)); a == nil || a.GetReject() || a.GetTerm() != 6 {
		t.Errorf("grant: %v", a)
	}
}
