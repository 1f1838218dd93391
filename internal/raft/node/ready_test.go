package node

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/kedge-dev/kedge/internal/raft/api"
	"github.com/kedge-dev/kedge/internal/raft/config"
	"github.com/kedge-dev/kedge/internal/raft/storage"
	pb "go.etcd.io/raft/v3/raftpb"
)

// TestReadyContract checks, at the moment each Ready's messages are handed to the
// transport, that what they promise is already in the WAL on disk: an append acknowledged
// (MsgAppResp) is there up to its index; a granted vote is recorded for that candidate in
// that term; the entries a leader sends are its own durable ones or those of the batch it
// is saving meanwhile (etcd-raft: "Messages may be sent while entries from the same batch
// are being persisted"), and it does send some of those before they are durable (the
// leader's fsync overlaps its followers'). It runs a 3-node cluster through an election and
// writes, and also checks that the transport was not bypassed.
func TestReadyContract(t *testing.T) {
	var (
		mu         sync.Mutex
		checked    = map[pb.MessageType]int{}
		violations []string
	)
	c := &cluster{t: t, nodes: map[uint64]*Node{}, cancel: map[uint64]context.CancelFunc{}, errs: map[uint64]chan error{}}
	base := newCluster(t, 3, nil) // for its configs: stop it and reuse the configs with hooks
	for id := range base.nodes {
		base.stop(id)
	}
	c.cfgs = base.cfgs
	for _, cfg := range c.cfgs {
		cfg.DataDir += "-contract"
	}
	early := 0 // leader appends sent before their entries were durable
	hook := func(cfg *config.Config) func([]*pb.Message, []*pb.Entry) {
		return func(msgs []*pb.Message, saving []*pb.Entry) {
			if len(msgs) == 0 {
				return
			}
			hs, last, _, err := storage.Durable(cfg.DataDir)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				violations = append(violations, err.Error())
				return
			}
			for _, m := range msgs {
				bad := ""
				switch m.GetType() {
				case pb.MsgAppResp:
					if !m.GetReject() && m.GetIndex() > last {
						bad = fmt.Sprintf("acks index %d, durable log ends at %d", m.GetIndex(), last)
					}
				case pb.MsgVoteResp:
					if !m.GetReject() && (hs.GetTerm() != m.GetTerm() || hs.GetVote() != m.GetTo()) {
						bad = fmt.Sprintf("grants term %d to %d, durable term %d vote %d", m.GetTerm(), m.GetTo(), hs.GetTerm(), hs.GetVote())
					}
				case pb.MsgApp:
					end := last
					if n := len(saving); n > 0 && saving[0].GetIndex() <= last+1 {
						end = saving[n-1].GetIndex() // the batch being saved meanwhile
					}
					if n := len(m.GetEntries()); n > 0 && m.GetEntries()[n-1].GetIndex() > end {
						bad = fmt.Sprintf("sends entries up to %d, durable log ends at %d (%d entries being saved)", m.GetEntries()[n-1].GetIndex(), last, len(saving))
					} else if n > 0 && m.GetEntries()[n-1].GetIndex() > last {
						early++
					}
				}
				if m.GetTerm() > hs.GetTerm() && m.GetType() != pb.MsgPreVote && m.GetType() != pb.MsgPreVoteResp {
					bad = fmt.Sprintf("term %d above the durable term %d", m.GetTerm(), hs.GetTerm())
				}
				if bad != "" {
					violations = append(violations, fmt.Sprintf("node %d %v: %s", cfg.ID, m.GetType(), bad))
				}
				checked[m.GetType()]++
			}
		}
	}
	c.hooks = map[uint64]func([]*pb.Message, []*pb.Entry){}
	for id := uint64(1); id <= 3; id++ {
		c.hooks[id] = hook(c.cfgs[id-1])
		c.start(id)
	}
	t.Cleanup(func() {
		for id := range c.nodes {
			c.stop(id)
		}
	})
	lead := c.waitLeader()
	ctx := context.Background()
	for i := range 20 {
		retry(t, "put", func() (api.WriteResponse, error) { return c.client(uint64(i%3+1)).Put(ctx, fmt.Sprint("k", i), "v") })
	}
	// A second election: stop the leader; the others elect among themselves.
	c.stop(lead)
	c.waitLeader()
	mu.Lock()
	defer mu.Unlock()
	for _, v := range violations {
		t.Error(v)
	}
	for _, typ := range []pb.MessageType{pb.MsgApp, pb.MsgAppResp, pb.MsgVoteResp, pb.MsgHeartbeat} {
		if checked[typ] == 0 {
			t.Errorf("no %v checked: the test did not exercise it (%v)", typ, checked)
		}
	}
	if early == 0 {
		t.Error("no leader append went out while its entries were being saved: the leader's fsync does not overlap its followers'")
	}
	t.Logf("messages checked: %v; leader appends sent during their save: %d", checked, early)
}
