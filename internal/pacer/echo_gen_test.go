package pacer

// The reference consumer (bpf/pacer/echo.bpf.c): test-only bindings (echo_bpfel_test.go), so
// the package embeds no test object. -no-global-types: the pacer's types come from gen.go,
// once.
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -mcpu=v3 -Wall -Werror -I../../bpf/include" -target bpfel -no-global-types -type echo_limits -type echo_config -type echo_slot -type echo_stats echo ../../bpf/pacer/echo.bpf.c
