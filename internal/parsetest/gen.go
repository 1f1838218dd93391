// Package parsetest holds the BPF_PROG_TEST_RUN fixtures for bpf/include/parse.h.
package parsetest

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -mcpu=v3 -Wall -Werror -I../../bpf/include" -target bpfel -type parse_result parsetest ../../bpf/parsetest/parsetest.bpf.c
