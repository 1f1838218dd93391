package sg

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -mcpu=v3 -Wall -Werror -I../../bpf/include" -target bpfel -type sg_group -type sg_worker -type sg_result -type sg_slot -type sg_stats -type kedge_mark sg ../../bpf/sg/sg.bpf.c
