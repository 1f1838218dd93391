package hedge

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -mcpu=v3 -Wall -Werror -I../../bpf/include" -target bpfel -type svc_key -type svc_addr -type replica_ref -type svc_cfg -type svc_state -type hreq_key -type hreq -type hedge_stats -type khist -type dl_stats -type dl_ctl hedge ../../bpf/hedge/hedge.bpf.c
