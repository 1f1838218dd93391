package kernelpaths

import (
	"slices"
	"testing"

	"github.com/kedge-dev/kedge/internal/raft/offload"
	pb "go.etcd.io/raft/v3/raftpb"
)

func TestQuorumVoters(t *testing.T) {
	for _, tc := range []struct {
		name string
		cs   *pb.ConfState
		want []uint64
	}{
		{"three voters", &pb.ConfState{Voters: []uint64{3, 1, 2}}, []uint64{1, 3}},
		{"learners do not count", &pb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{4}}, []uint64{1, 3}},
		{"alone", &pb.ConfState{Voters: []uint64{2}}, nil},
		{"not a voter", &pb.ConfState{Voters: []uint64{1, 3}, Learners: []uint64{2}}, nil},
		{"joint", &pb.ConfState{Voters: []uint64{1, 2, 3}, VotersOutgoing: []uint64{1, 2}}, nil},
		{"empty (restarting before the log's configuration is applied)", &pb.ConfState{}, nil},
		{"too many", func() *pb.ConfState {
			cs := &pb.ConfState{}
			for id := uint64(1); id <= uint64(offload.MaxVoters)+2; id++ {
				cs.Voters = append(cs.Voters, id)
			}
			return cs
		}(), nil},
	} {
		if got := quorumVoters(tc.cs, 2); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
