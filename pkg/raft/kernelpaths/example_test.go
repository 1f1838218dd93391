package kernelpaths_test

import (
	"context"
	"net/netip"
	"time"

	"github.com/kedge-dev/kedge/pkg/raft/kernelpaths"
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// persist stands for the application's write-ahead log: it makes the Ready's HardState and
// entries durable (fsync when sync) and then appends them to the raft.Storage.
func persist(st *raft.MemoryStorage, hs *pb.HardState, ents []*pb.Entry, sync bool) error {
	if err := st.Append(ents); err != nil {
		return err
	}
	if hs != nil && !raft.IsEmptyHardState(hs) {
		return st.SetHardState(hs)
	}
	return nil
}

// An etcd-raft application's Ready loop with the kernel paths: the Offload is its transport,
// Tick replaces rn.Tick, and each Ready passes BeforeSave, the save, AfterSave and Send in
// the contract's order. examples/raftkv is a complete application.
func Example() {
	const tick = 10 * time.Millisecond
	peers := []kernelpaths.Peer{
		{ID: 1, Addr: netip.MustParseAddrPort("10.0.0.1:7000")},
		{ID: 2, Addr: netip.MustParseAddrPort("10.0.0.2:7000")},
		{ID: 3, Addr: netip.MustParseAddrPort("10.0.0.3:7000")},
	}
	off, err := kernelpaths.Open(kernelpaths.Config{ClusterID: 1, ID: 1, Peers: peers,
		Tick: tick, ElectionTicks: 10, HeartbeatTicks: 1,
		Follower: kernelpaths.Auto, LeaderHeartbeats: kernelpaths.Auto})
	if err != nil {
		panic(err)
	}
	st := raft.NewMemoryStorage()
	rn := raft.StartNode(&raft.Config{ID: 1, ElectionTick: 10, HeartbeatTick: 1, Storage: st,
		MaxSizePerMsg: 1 << 20, MaxInflightMsgs: 256, PreVote: true, CheckQuorum: true},
		[]raft.Peer{{ID: 1}, {ID: 2}, {ID: 3}})
	if err := off.Start(rn, st); err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-ticker.C:
			off.Tick(ctx)
		case w := <-off.Wakeups():
			off.Wake(ctx, w)
		case rd := <-rn.Ready():
			off.Send(off.BeforeSave(&rd))
			if err := persist(st, rd.HardState, rd.Entries, rd.MustSync); err != nil {
				break loop // nothing of this Ready may be sent
			}
			off.AfterSave(&rd)
			off.Send(rd.Messages)
			for _, e := range rd.CommittedEntries {
				if e.GetType() == pb.EntryConfChange {
					var cc pb.ConfChange
					if err := proto.Unmarshal(e.GetData(), &cc); err == nil {
						off.SetConfState(rn.ApplyConfChange(&cc))
					}
				}
				// ... apply e to the state machine
			}
			rn.Advance()
			off.Advanced()
		}
	}
	off.Close()
	rn.Stop()
}
