package offload

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -mcpu=v3 -Wall -Werror -I../../../bpf/include -I../../../bpf/raft" -target bpfel -type raftx_state -type raftx_hb -type raftx_event -type raftx_stats -type raftx_ack -type raftx_word -type raftx_quorum raftxdp ../../../bpf/raft/raftxdp.bpf.c
