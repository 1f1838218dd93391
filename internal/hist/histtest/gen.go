// Package histtest holds the BPF_PROG_TEST_RUN fixtures that pin bpf/include/hist.h to its
// Go mirror, internal/hist.
package histtest

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -mcpu=v3 -Wall -Werror -I../../../bpf/include" -target bpfel -type hist_case histtest ../../../bpf/histtest/histtest.bpf.c
