package hedge

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -mcpu=v3 -Wall -Werror -I../../bpf/include -I../../bpf/hedge" -target bpfel -no-global-types -type hedge_config -type svc_key -type svc_addr -type replica_ref -type svc_cfg -type svc_state -type hreq_key -type hreq -type hedge_stats -type khist -type hedge_limits -type delay_mode -type req_state -type reqid_order -type budget_mode -type replica_choice -type hedge_rule -type hstore -type store_pos -type kedge_mark hedge ../../bpf/hedge/hedge.bpf.c
