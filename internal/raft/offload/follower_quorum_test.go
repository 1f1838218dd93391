package offload

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/raft/wire"
	"go.etcd.io/raft/v3/quorum"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// The quorum wait's fixtures: this node (fxSelf) leads; voters 1, 3, 4, 5 at .1, .3-.5,
// and a learner, 6, at .6.
const fxLearner = 6

func quorumPeers() []wire.AuthPeer {
	var ps []wire.AuthPeer
	for _, id := range []uint64{fxLeader, fxOther, 4, 5, fxLearner} {
		ps = append(ps, wire.AuthPeer{ID: id, Addr: peerAddr(id)})
	}
	return ps
}

func peerAddr(id uint64) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 77, 0, byte(id)}), fxPort)
}

// appResp is the frame of voter from's MsgAppResp for index at term.
func appResp(t testing.TB, from, term, index uint64, reject bool) []byte {
	t.Helper()
	m := &pb.Message{Type: pb.MsgAppResp.Enum(), From: proto.Uint64(from), To: proto.Uint64(fxSelf),
		Term: proto.Uint64(term), Index: proto.Uint64(index)}
	if reject {
		m.Reject, m.RejectHint = proto.Bool(true), proto.Uint64(index-1)
	}
	var b [wire.PktLen]byte
	p, err := wire.Encode(b[:], fxCluster, m)
	if err != nil {
		t.Fatalf("encode MsgAppResp: %v", err)
	}
	return frame(peerAddr(from), self4, 9, p)
}

func loadLeading(t *testing.T, voters []uint64) *Follower {
	t.Helper()
	f := loadFixture(t, FollowerOptions{AliveFor: time.Hour, Detect: time.Hour, Peers: quorumPeers()})
	if err := f.Mirror(Durable{Term: fxTerm, Leader: fxSelf, LeaderAddr: self4}); err != nil {
		t.Fatal(err)
	}
	if err := f.SetVoters(voters); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestFollowerQuorumWait: the program records a voter's MsgAppResp while this node leads and
// absorbs the ones that move neither its match nor the commit index (3 nodes: the other
// voter acknowledged the index already); rejections, other terms, learners, a node that does
// not lead and a wait without voters pass everything up.
func TestFollowerQuorumWait(t *testing.T) {
	f := loadLeading(t, []uint64{fxLeader, fxOther})
	r := bpftest.Runner{Prog: f.objs.RaftxXdp, Counters: counters(f)}
	recorded := bpftest.Counters{"rx": 1, "app_recorded": 1}
	absorbed := bpftest.Counters{"rx": 1, "app_absorbed": 1}
	passed := bpftest.Counters{"rx": 1, "passed_type": 1}
	pass, drop := uint32(bpftest.XDPPass), uint32(bpftest.XDPDrop)
	r.Run(t, []bpftest.Case{
		{Name: "first ack of 10: moves the commit", In: appResp(t, 1, fxTerm, 10, false), WantRet: pass, WantCounters: recorded},
		{Name: "the other voter's ack of 10: absorbed", In: appResp(t, 3, fxTerm, 10, false), WantRet: drop, WantCounters: absorbed},
		{Name: "a duplicate (the answer to a commit-only append): absorbed", In: appResp(t, 1, fxTerm, 10, false), WantRet: drop, WantCounters: absorbed},
		{Name: "an older index: absorbed", In: appResp(t, 3, fxTerm, 7, false), WantRet: drop, WantCounters: absorbed},
		{Name: "ahead of the other voter: passed", In: appResp(t, 3, fxTerm, 12, false), WantRet: pass, WantCounters: recorded},
		{Name: "behind the other voter: absorbed", In: appResp(t, 1, fxTerm, 11, false), WantRet: drop, WantCounters: absorbed},
		{Name: "a rejection", In: appResp(t, 1, fxTerm, 11, true), WantRet: pass, WantCounters: passed},
		{Name: "an older term", In: appResp(t, 1, fxTerm-1, 5, false), WantRet: pass, WantCounters: passed},
		{Name: "a newer term", In: appResp(t, 1, fxTerm+1, 5, false), WantRet: pass, WantCounters: passed},
		{Name: "a learner", In: appResp(t, fxLearner, fxTerm, 5, false), WantRet: pass, WantCounters: passed},
	})
	term, vs, err := f.Quorum()
	if err != nil {
		t.Fatal(err)
	}
	want := []VoterAck{{ID: 1, Index: 11, Count: 3, Absorbed: 2}, {ID: 3, Index: 12, Count: 3, Absorbed: 2}}
	if term != fxTerm || fmt.Sprint(vs) != fmt.Sprint(want) {
		t.Errorf("records: term %d %+v, want term %d %+v", term, vs, fxTerm, want)
	}

	// A new term this node leads: the records start over.
	if err := f.Mirror(Durable{Term: fxTerm + 1, Leader: fxSelf, LeaderAddr: self4}); err != nil {
		t.Fatal(err)
	}
	r.Run(t, []bpftest.Case{
		{Name: "new term: first ack passed", In: appResp(t, 3, fxTerm+1, 2, false), WantRet: pass, WantCounters: recorded},
		{Name: "new term: the other's absorbed", In: appResp(t, 1, fxTerm+1, 2, false), WantRet: drop, WantCounters: absorbed},
	})
	if term, vs, _ := f.Quorum(); term != fxTerm+1 || vs[0].Index != 2 || vs[1].Count != 1 {
		t.Errorf("records after the new term: %d %+v", term, vs)
	}

	// Another node leads: nothing recorded, nothing absorbed.
	if err := f.Mirror(Durable{Term: fxTerm + 1, Leader: fxOther, LeaderAddr: other4}); err != nil {
		t.Fatal(err)
	}
	r.Run(t, []bpftest.Case{
		{Name: "following", In: appResp(t, 1, fxTerm+1, 2, false), WantRet: pass, WantCounters: passed},
	})
	// Leading, but the wait is off (no voters: a joint configuration).
	if err := f.Mirror(Durable{Term: fxTerm + 1, Leader: fxSelf, LeaderAddr: self4}); err != nil {
		t.Fatal(err)
	}
	if err := f.SetVoters(nil); err != nil {
		t.Fatal(err)
	}
	r.Run(t, []bpftest.Case{
		{Name: "no voters", In: appResp(t, 1, fxTerm+1, 2, false), WantRet: pass, WantCounters: passed},
	})
}

// ackIndex is an etcd-raft quorum.AckedIndexer over a map.
type ackIndex map[uint64]uint64

func (a ackIndex) AckedIndex(id uint64) (quorum.Index, bool) {
	v, ok := a[id]
	return quorum.Index(v), ok
}

// TestFollowerQuorumWaitCommit is the quorum wait's correctness argument run against the
// program: over random acknowledgement sequences (3 and 5 voters; acks out of order,
// duplicated, stale), the commit index etcd-raft's quorum computes from the responses the
// program passed equals the one it computes from all of them, after every packet - so
// absorbing never delays a commit - while the program does absorb. The leader's own
// acknowledgement is at the end of the log (etcd-raft's leader acknowledges its entries
// once they are durable, before it sends them).
func TestFollowerQuorumWaitCommit(t *testing.T) {
	for _, voters := range [][]uint64{{1, 3}, {1, 3, 4, 5}} {
		t.Run(fmt.Sprintf("%d voters", len(voters)+1), func(t *testing.T) {
			f := loadLeading(t, voters)
			cfg := quorum.MajorityConfig{fxSelf: {}}
			for _, id := range voters {
				cfg[id] = struct{}{}
			}
			rng := rand.New(rand.NewPCG(1, uint64(len(voters))))
			all, seen := ackIndex{}, ackIndex{} // highest of every ack, of the passed ones
			var last uint64                     // the log's end (the leader's own ack)
			var absorbed int
			for i := range 4000 {
				if rng.IntN(3) == 0 {
					last += uint64(1 + rng.IntN(3)) // the leader appends
				}
				id := voters[rng.IntN(len(voters))]
				idx := all[id] // a duplicate ...
				switch rng.IntN(4) {
				case 0, 1: // ... or further, up to the log's end ...
					if last > idx {
						idx += uint64(1 + rng.IntN(int(last-idx)))
					}
				case 2: // ... or a late, older one
					if idx > 0 {
						idx -= uint64(rng.IntN(int(idx)))
					}
				}
				ret, _, err := f.Run(appResp(t, id, fxTerm, idx, false))
				if err != nil {
					t.Fatal(err)
				}
				all[id] = max(all[id], idx)
				switch ret {
				case bpftest.XDPPass:
					seen[id] = max(seen[id], idx)
				case bpftest.XDPDrop:
					absorbed++
				default:
					t.Fatalf("packet %d: verdict %d", i, ret)
				}
				all[fxSelf], seen[fxSelf] = last, last
				if got, want := cfg.CommittedIndex(seen), cfg.CommittedIndex(all); got != want {
					t.Fatalf("packet %d (voter %d acks %d): commit from the passed acks %d, from all %d (all %v, passed %v)",
						i, id, idx, got, want, all, seen)
				}
			}
			if absorbed < 1000 {
				t.Errorf("absorbed %d of 4000: the wait hardly works", absorbed)
			}
			t.Logf("absorbed %d of 4000", absorbed)
		})
	}
}
