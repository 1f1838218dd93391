// Package parsetest holds the BPF_PROG_TEST_RUN fixtures for the shared headers of
// bpf/include: parse.h (parsetest) and csum.h (csumtest).
package parsetest

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -mcpu=v3 -Wall -Werror -I../../bpf/include" -target bpfel -type parse_result parsetest ../../bpf/parsetest/parsetest.bpf.c
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -mcpu=v3 -Wall -Werror -I../../bpf/include" -target bpfel csumtest ../../bpf/parsetest/csumtest.bpf.c
