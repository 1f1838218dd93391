package offload

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -mcpu=v3 -Wall -Werror -I../../../bpf/include -I../../../bpf/raft" -target bpfel -no-global-types -type raft_leader_consts -type raft_follower -type raft_lease -type raft_leader_state -type raft_leader_stats leader ../../../bpf/raft/leader.bpf.c
