package pacer

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -mcpu=v3 -Wall -Werror -I../../bpf/include" -target bpfel -type pacer_backend -type pacer_consts -type pacer_magic -type pacer_req -type pacer_rx -type pacer_state -type pacer_tick -type pacer_filler -type pacer_ctl -type pacer_stats pacer ../../bpf/pacer/pacer.bpf.c
