package lab

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -mcpu=v3 -Wall -Werror -I../../bpf/include" -target bpfel -type fab_link_key -type fab_fault -type fab_stats -type kedge_mark fabric ../../bpf/lab/fabric.bpf.c
