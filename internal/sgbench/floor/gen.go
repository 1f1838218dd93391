// Package floor is the floor of the sg loopback benchmark (method "floor"): the cheapest
// in-kernel scatter-gather that moves the same packets as kedge's (bpf/sgfloor/floor.bpf.c), and the
// client side that loads it, attaches it to lo and reads its completions. It does no
// reduction and checks nothing: a lower bound for the benchmark, not a product.
package floor

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -mcpu=v3 -Wall -Werror -I../../../bpf/include" -target bpfel floor ../../../bpf/sgfloor/floor.bpf.c
