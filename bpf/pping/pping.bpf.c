// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* pping: passive RTT monitoring in the kernel (after ePPing, xdp-project/bpf-examples).
 *
 * Two TC programs on one interface, pping_egress and pping_ingress, run the same pipeline:
 *   parse (parse.h) -> identify (ident.h) -> timestamp the request / match the reply
 *   (flow.h) -> count (every packet lands in exactly one counter of maps.h's pp_counters).
 * Two map iterators, pping_gc_ts and pping_gc_flow, expire stale state when user space runs
 * them (every second by default): process context, preemptible, no softirq time taken from
 * the packets being measured, and the natural place to report timed-out flows.
 * The contract with user space is bpf/include/pping.h. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "flow.h"

/* Ring-buffer records user space decodes: referenced here so their BTF reaches bpf2go. */
const struct pp_rtt_event *pp_btf_rtt __attribute__((unused));
const struct pp_flow_event *pp_btf_flow __attribute__((unused));
const struct pp_map_full_event *pp_btf_full __attribute__((unused));

/* The packet being processed, per CPU: pp_parse() fills it for pp_handle(). Neither
 * program can run nested on one CPU: egress runs with bottom halves disabled, so ingress
 * cannot interrupt it, and neither sends or redirects packets. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pp_pkt);
} scratch SEC(".maps");

/* Parse and identify into scratch. Returns 0 when the packet carries an identifier or an
 * echo; every other packet is counted here. A global function, verified once rather than
 * per path through the flow logic (about 42k instead of 67k instructions processed per
 * hook; most of them are parse_pkt()'s); it takes only the context and a scalar, which
 * kernels before 5.12 require of global functions. */
__noinline int pp_parse(struct __sk_buff *skb, __u32 hook)
{
	struct pp_counters *cnt = pp_counters_get(hook);
	__u32 zero = 0;
	struct pp_pkt *pp = bpf_map_lookup_elem(&scratch, &zero);
	void *data, *data_end;
	int err;

	if (!skb || !cnt || !pp)
		return -1;
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	__builtin_memset(pp, 0, sizeof(*pp));
	err = parse_pkt(data, data_end, &pp->p);
	if (err < 0) {
		pp_count_parse_err(cnt, err);
		return -1;
	}
	return pp_identify(skb, data, data_end, pp, cnt);
}

static __always_inline int pp_handle(struct __sk_buff *skb, __u32 hook)
{
	struct pp_counters *cnt = pp_counters_get(hook);
	__u32 zero = 0;
	struct pp_pkt *pp;

	if (!cnt)
		return TC_ACT_UNSPEC;
	cnt->pkts++;
	cnt->bytes += skb->len;
	if (pp_parse(skb, hook) < 0) /* parse, decide */
		return TC_ACT_UNSPEC;
	pp = bpf_map_lookup_elem(&scratch, &zero);
	if (!pp)
		return TC_ACT_UNSPEC;
	pp->is_ingress = hook == PP_HOOK_INGRESS;
	pp->now = bpf_ktime_get_ns();
	pp_process(skb, pp, cnt); /* act, count */
	/* TCX_NEXT / TC_ACT_UNSPEC: a monitor never decides a packet's fate. */
	return TC_ACT_UNSPEC;
}

SEC("tc")
int pping_egress(struct __sk_buff *skb)
{
	return pp_handle(skb, PP_HOOK_EGRESS);
}

SEC("tc")
int pping_ingress(struct __sk_buff *skb)
{
	return pp_handle(skb, PP_HOOK_INGRESS);
}

/* Expires unmatched identifiers after clamp(8 x srtt, ts_min_lifetime, ts_max_lifetime):
 * a short-RTT flow's lost replies are forgotten quickly, a long-RTT flow keeps its
 * identifiers long enough to be matched. */
SEC("iter/bpf_map_elem")
int pping_gc_ts(struct bpf_iter__bpf_map_elem *ctx)
{
	struct pp_pkt_id *id = ctx->key;
	__u64 *stored = ctx->value;
	struct pp_dir_state *d = NULL;
	struct pp_counters *cnt;
	struct pp_flow_state *fs;
	struct pp_tuple key;
	struct pp_pkt_id del;
	__u64 now, life;
	int first;

	if (!id || !stored)
		return 0;
	now = bpf_ktime_get_ns();
	if (now <= *stored)
		return 0;
	first = pp_src_sorts_first(&id->flow);
	if (first)
		key = id->flow;
	else
		pp_reverse(&key, &id->flow);
	fs = bpf_map_lookup_elem(&flows, &key);
	if (fs)
		d = first ? &fs->dir[0] : &fs->dir[1];
	life = pp_cfg.ts_max_lifetime_ns;
	if (d && d->srtt && d->srtt * PP_TS_RTT_MULT < life)
		life = d->srtt * PP_TS_RTT_MULT;
	if (life < pp_cfg.ts_min_lifetime_ns)
		life = pp_cfg.ts_min_lifetime_ns;
	if (now - *stored <= life)
		return 0;
	del = *id;
	if (bpf_map_delete_elem(&pkt_ts, &del) != 0)
		return 0;
	if (d && d->outstanding)
		__sync_fetch_and_add(&d->outstanding, -1);
	cnt = pp_counters_get(PP_HOOK_GC);
	if (cnt)
		cnt->gc_ts_expired++;
	return 0;
}

/* Deletes flows whose directions are all closed or idle, reporting the open ones that timed
 * out (reply-side first, like every flow event). */
SEC("iter/bpf_map_elem")
int pping_gc_flow(struct bpf_iter__bpf_map_elem *ctx)
{
	struct pp_tuple *key = ctx->key, k, rev;
	struct pp_flow_state *fs = ctx->value;
	struct pp_counters *cnt;
	int exp0, exp1, notify0, notify1;
	__u64 now;

	if (!key || !fs)
		return 0;
	now = bpf_ktime_get_ns();
	exp0 = pp_dir_expired(&fs->dir[0], key->proto, now);
	exp1 = pp_dir_expired(&fs->dir[1], key->proto, now);
	if ((pp_active(&fs->dir[0]) && !exp0) || (pp_active(&fs->dir[1]) && !exp1))
		return 0;
	notify0 = exp0 && fs->dir[0].conn == PP_CONN_OPEN;
	notify1 = exp1 && fs->dir[1].conn == PP_CONN_OPEN;
	k = *key;
	if (bpf_map_delete_elem(&flows, &k) != 0)
		return 0;
	cnt = pp_counters_get(PP_HOOK_GC);
	if (!cnt)
		return 0;
	cnt->gc_flow_expired++;
	if (!pp_cfg.push_events)
		return 0;
	pp_reverse(&rev, &k);
	if (notify0) /* dir[0] runs k.saddr -> k.daddr; its replies come from k.daddr */
		pp_send_flow(cnt, &rev, now, PP_FLOW_CLOSING, PP_REASON_TIMEOUT, PP_SOURCE_GC);
	if (notify1)
		pp_send_flow(cnt, &k, now, PP_FLOW_CLOSING, PP_REASON_TIMEOUT, PP_SOURCE_GC);
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
