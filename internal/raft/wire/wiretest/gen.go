// Package wiretest holds the BPF objects that internal/raft/wire's tests run: raftwire.bpf.c
// (the kernel-side decoder of bpf/include/raft.h) and authtest.bpf.c (the authenticator and
// the pre-vote rule), each exposing a header to BPF_PROG_TEST_RUN. Test-only: the wire
// package itself embeds no BPF object.
package wiretest

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -mcpu=v3 -Wall -Werror -I../../../../bpf/include" -target bpfel -type raft_hdr -type raftwire_result Raftwire ../../../../bpf/raft/raftwire.bpf.c
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -mcpu=v3 -Wall -Werror -I../../../../bpf/include" -target bpfel -type raft_auth_config -type raft_peer -type siphash_vec -type authtest_verdict -type raft_pv_view -type raft_pv_why Authtest ../../../../bpf/raft/authtest.bpf.c
