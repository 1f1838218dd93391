// Package selftest holds the BPF object that internal/bpftest's own tests run: a small
// stateful program (bpf/bpftest/fixture.bpf.c) touching every part of the fixture style.
// Test-only: nothing outside internal/bpftest's tests imports it.
package selftest

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -mcpu=v3 -Wall -Werror -I../../../bpf/include" -target bpfel -type fixture_counters -output-stem fixture Fixture ../../../bpf/bpftest/fixture.bpf.c
