package wire

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -mcpu=v3 -Wall -Werror -I../../../bpf/include" -target bpfel -type raft_hdr -type raftwire_result raftwire ../../../bpf/raft/raftwire.bpf.c
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -mcpu=v3 -Wall -Werror -I../../../bpf/include" -target bpfel -type raft_auth_config -type raft_peer -type siphash_vec -type authtest_verdict -type raft_pv_view -type raft_pv_why authtest ../../../bpf/raft/authtest.bpf.c
