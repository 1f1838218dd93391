package kernelpaths

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// suppressTo is a HeartbeatOffload whose kernel sends the heartbeats to one follower.
type suppressTo uint64

func (suppressTo) Update(bool, uint64, uint64, map[uint64]uint64) {}
func (s suppressTo) Suppress(to, term uint64) bool                { return to == uint64(s) }

// kernelHeartbeats leaves out what the kernel sends - heartbeats without a context to the
// follower it serves - keeps everything else in order, and allocates nothing (it runs on
// every Ready).
func TestKernelHeartbeats(t *testing.T) {
	msg := func(typ pb.MessageType, to uint64, ctx []byte) *pb.Message {
		return &pb.Message{Type: typ.Enum(), To: proto.Uint64(to), Term: proto.Uint64(4), Context: ctx}
	}
	in := []*pb.Message{
		msg(pb.MsgHeartbeat, 2, nil),            // the kernel's
		msg(pb.MsgApp, 2, nil),                  //
		msg(pb.MsgHeartbeat, 3, nil),            // another follower's
		msg(pb.MsgHeartbeat, 2, []byte("read")), // a ReadIndex round
		msg(pb.MsgHeartbeat, 2, nil),            // the kernel's
		msg(pb.MsgAppResp, 3, nil),              //
	}
	want := []*pb.Message{in[1], in[2], in[3], in[5]}
	n := &Offload{hb: suppressTo(2), hbKernel: prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})}
	buf := make([]*pb.Message, len(in))
	var out []*pb.Message
	allocs := testing.AllocsPerRun(100, func() {
		copy(buf, in)
		out = n.kernelHeartbeats(buf)
	})
	if len(out) != len(want) {
		t.Fatalf("sent %d messages, want %d", len(out), len(want))
	}
	for i := range want {
		if out[i] != want[i] {
			t.Errorf("message %d: %v to %d, want %v to %d", i, out[i].GetType(), out[i].GetTo(), want[i].GetType(), want[i].GetTo())
		}
	}
	if allocs != 0 {
		t.Errorf("%v allocations per Ready, want 0", allocs)
	}
}

// The warning's condition: the follower path without kernel heartbeats, below the kernel
// paths' minimum bound.
func TestFollowerOnlyShort(t *testing.T) {
	for _, c := range []struct {
		follower, kernelHB bool
		et                 time.Duration
		want               bool
	}{
		{true, false, 10 * time.Millisecond, true},
		{true, false, 99 * time.Millisecond, true},
		{true, false, 100 * time.Millisecond, false},
		{true, true, 10 * time.Millisecond, false},
		{false, false, 10 * time.Millisecond, false},
	} {
		if got := followerOnlyShort(c.follower, c.kernelHB, c.et); got != c.want {
			t.Errorf("follower %v, kernel heartbeats %v, election timeout %v: %v, want %v", c.follower, c.kernelHB, c.et, got, c.want)
		}
	}
}
