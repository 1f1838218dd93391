package kernelpaths

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/raft/offload"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// stepSpy is the etcd-raft node of TestTransportStepRecordsWord: it notes the kernel's last
// word when a message reaches Step, and when Step returns.
type stepSpy struct {
	raft.Node // nil: only Step is called
	k         *offload.Follower
	atStep    time.Duration
	returned  time.Duration
}

func (s *stepSpy) Step(ctx context.Context, m *pb.Message) error {
	s.atStep = s.k.Word()
	s.returned = offload.Monotonic()
	return nil
}

// The node stores the leader's last word for every message that restarts etcd-raft's lease
// (an append, heartbeat or snapshot at the mirrored term or newer), before etcd-raft takes it
// - so the kernel never knows less than etcd-raft - and again after, so the kernel's lease
// runs at least an election timeout from when etcd-raft restarted its own. Other messages,
// and an append of a deposed leader's older term, leave it alone.
func TestTransportStepRecordsWord(t *testing.T) {
	k := loadEqProgram(t)
	const term = 5
	if err := k.Mirror(offload.Durable{Term: term, Leader: eqLeader, LeaderAddr: eqLeaderAddr, LastIndex: eqLast, LastTerm: 1}); err != nil {
		t.Fatal(err)
	}
	spy := &stepSpy{k: k}
	n := &Offload{fol: &follower{k: k, detect: 10 * time.Millisecond}, rn: spy, log: slog.New(slog.DiscardHandler)}
	in := transportIn{n}
	for _, c := range []struct {
		typ    pb.MessageType
		term   uint64
		record bool
	}{
		{pb.MsgApp, term, true},
		{pb.MsgHeartbeat, term, true},
		{pb.MsgSnap, term, true},
		{pb.MsgApp, term + 1, true}, // a new leader's first append: etcd-raft follows it
		{pb.MsgApp, term - 1, false},
		{pb.MsgHeartbeat, term - 1, false},
		{pb.MsgAppResp, term, false},
		{pb.MsgVote, term + 1, false},
		{pb.MsgPreVote, term + 1, false},
		{pb.MsgTimeoutNow, term, false},
		{pb.MsgReadIndexResp, term, false},
	} {
		m := &pb.Message{Type: c.typ.Enum(), From: proto.Uint64(eqLeader), To: proto.Uint64(eqSelf), Term: proto.Uint64(c.term)}
		before := k.Word()
		start := offload.Monotonic()
		if err := in.Step(context.Background(), m); err != nil {
			t.Fatal(err)
		}
		after := k.Word()
		if !c.record {
			if after != before {
				t.Errorf("%v at term %d: the word moved from %v to %v, want it left alone", c.typ, c.term, before, after)
			}
			continue
		}
		if spy.atStep < start {
			t.Errorf("%v at term %d: the word was %v when etcd-raft took it (call at %v): stored too late", c.typ, c.term, spy.atStep, start)
		}
		if after < spy.returned {
			t.Errorf("%v at term %d: the word is %v, etcd-raft returned at %v: not stored again after it", c.typ, c.term, after, spy.returned)
		}
	}
}

// lastWord, the one definition of "heard" the node's judges share with the program
// (prevote.h raft_pv_heard): the later of the program's heartbeat record of that leader and
// the word. A vote request an election timeout after the last heartbeat, but less after an
// append user space stepped, is left to etcd-raft (which ignores it: its lease restarted on
// the append); judged on the heartbeat record alone it was let past the lease.
func TestLastWord(t *testing.T) {
	const et = 10 * time.Millisecond
	k := loadEqProgram(t)
	if err := k.Mirror(offload.Durable{Term: 1, Leader: eqLeader, LeaderAddr: eqLeaderAddr, LastIndex: eqLast, LastTerm: 1}); err != nil {
		t.Fatal(err)
	}
	if err := k.Alive(); err != nil {
		t.Fatal(err)
	}
	n := &Offload{fol: &follower{k: k, detect: et}}
	if got := n.heardNs(eqLeader); got != 0 {
		t.Fatalf("nothing heard: heardNs %d, want 0", got)
	}
	hbm := &pb.Message{Type: pb.MsgHeartbeat.Enum(), From: proto.Uint64(eqLeader), To: proto.Uint64(eqSelf), Term: proto.Uint64(1)}
	frame, err := eqFrame(eqLeaderAddr, hbm)
	if err != nil {
		t.Fatal(err)
	}
	if ret, _, err := k.Run(frame); err != nil || ret != bpftest.XDPTx {
		t.Fatalf("heartbeat: verdict %d, err %v; want it answered", ret, err)
	}
	hb, err := k.Heartbeat()
	if err != nil {
		t.Fatal(err)
	}
	if got := n.heardNs(eqLeader); got != int64(hb.Arrival) {
		t.Fatalf("heartbeat only: heardNs %d, want its arrival %d", got, hb.Arrival)
	}
	if got := n.heardNs(eqProber); got != 0 {
		t.Errorf("another leader, nothing stored: heardNs %d, want 0", got)
	}
	appendAt := hb.Arrival + 3*time.Millisecond
	if err := k.Heard(appendAt); err != nil {
		t.Fatal(err)
	}
	if got := n.heardNs(eqLeader); got != int64(appendAt) {
		t.Fatalf("append after the heartbeat: heardNs %d, want the append's %d", got, appendAt)
	}
	if err := k.Heard(hb.Arrival - time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if got := n.heardNs(eqLeader); got != int64(appendAt) {
		t.Errorf("an older word stored: heardNs %d, want still %d", got, appendAt)
	}
	vote := func() *pb.Message {
		return &pb.Message{Type: pb.MsgVote.Enum(), From: proto.Uint64(eqProber), To: proto.Uint64(eqSelf), Term: proto.Uint64(2)}
	}
	if forceIfLeaseOver(vote(), eqLeader, eqSelf, n.heardNs(eqLeader), hb.Arrival+et, et) {
		t.Error("a vote an election timeout after the heartbeat but 3 ms less after the append was let past the lease")
	}
	if !forceIfLeaseOver(vote(), eqLeader, eqSelf, n.heardNs(eqLeader), appendAt+et, et) {
		t.Error("a vote an election timeout after the append was left to etcd-raft's ticks")
	}
}

func TestResetsLease(t *testing.T) {
	for _, c := range []struct {
		typ        pb.MessageType
		term, have uint64
		want       bool
	}{
		{pb.MsgApp, 3, 3, true}, {pb.MsgHeartbeat, 4, 3, true}, {pb.MsgSnap, 3, 3, true},
		{pb.MsgApp, 2, 3, false}, {pb.MsgHeartbeatResp, 3, 3, false}, {pb.MsgProp, 3, 3, false},
		{pb.MsgApp, 1, 0, true}, // nothing mirrored yet
	} {
		m := &pb.Message{Type: c.typ.Enum(), Term: proto.Uint64(c.term)}
		if got := resetsLease(m, c.have); got != c.want {
			t.Errorf("%v at term %d, mirrored term %d: %v, want %v", c.typ, c.term, c.have, got, c.want)
		}
	}
}
