package pping

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -mcpu=v3 -Wall -Werror -I../../bpf/include -I../../bpf/pping" -target bpfel -type pp_tuple -type pp_pkt_id -type pp_dir_shared -type pp_dir_own -type pp_flow_state -type pp_agg_key4 -type pp_agg_key6 -type pp_rtt_event -type pp_flow_event -type pp_map_full_event -type pp_counters -type pp_agg_stats -type pp_traffic -type pp_consts -type pp_event_type -type kedge_clock_consts pping ../../bpf/pping/pping.bpf.c
