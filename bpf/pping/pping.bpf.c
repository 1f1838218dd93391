// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* pping: passive RTT monitoring in the kernel (after ePPing, xdp-project/bpf-examples).
 *
 * Two packet programs on one interface, pping_egress (TC) and pping_ingress (TC) or pping_xdp
 * (XDP, --ingress-hook xdp), run the same pipeline:
 *   parse (parse.h) -> identify (ident.h) -> timestamp the request / match the reply
 *   (flow.h) -> count (every packet lands in exactly one counter of maps.h's pp_counters).
 * Two map iterators, pping_gc_ts and pping_gc_flow, expire stale state when user space runs
 * them (every second by default): process context, preemptible, no softirq time taken from
 * the packets being measured, and the natural place to report timed-out flows.
 * The contract with user space is bpf/include/pping.h. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "clock.h"
#include "counters.h"
#include "pping.h"
#include "maps.h"
#include "flow.h"

/* Ring-buffer records user space decodes: referenced here so their BTF reaches bpf2go. */
const struct pp_rtt_event *pp_btf_rtt __attribute__((unused));
const struct pp_flow_event *pp_btf_flow __attribute__((unused));
const struct pp_map_full_event *pp_btf_full __attribute__((unused));

/* The packet being processed, per CPU: pp_parse() fills it for pp_handle(). No program can
 * run nested on one CPU: egress runs with bottom halves disabled, so ingress (TC or XDP)
 * cannot interrupt it, and none of them sends or redirects packets. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pp_pkt);
} scratch SEC(".maps");

/* What pp_parse() found. */
enum pp_parsed {
	PP_PARSED_BAD = -1, /* not IP, or malformed: counted under parse_err */
	PP_PARSED_ID = 0,   /* carries an identifier or an echo */
	PP_PARSED_IP = 1,   /* IP, but nothing to measure: counted under a skip reason */
};

/* Parses and identifies the packet into scratch; returns an enum pp_parsed. */
static __always_inline int pp_parse_into(const struct pp_ctx *c, __u32 hook)
{
	struct pp_counters *cnt = pp_counters_get(hook);
	__u32 zero = 0;
	struct pp_pkt *pp = bpf_map_lookup_elem(&scratch, &zero);
	int err;

	if (!cnt || !pp)
		return PP_PARSED_BAD;
	__builtin_memset(pp, 0, sizeof(*pp));
	err = parse_pkt(c->data, c->data_end, &pp->p);
	if (err < 0) {
		pp_count_parse_err(cnt, err);
		return PP_PARSED_BAD;
	}
	return pp_identify(c, pp, cnt) < 0 ? PP_PARSED_IP : PP_PARSED_ID;
}

/* pp_parse_into() for TC and for XDP. Global functions, verified once rather than per path
 * through the flow logic (about 42k instead of 67k instructions processed per hook; most of
 * them are parse_pkt()'s); they take only the context and a scalar, which kernels before
 * 5.12 require of global functions, and one per context type because a global function is
 * verified for the context type it declares. */
__noinline int pp_parse(struct __sk_buff *skb, __u32 hook)
{
	struct pp_ctx c = {};

	if (!skb)
		return PP_PARSED_BAD;
	c.ctx = skb;
	c.data = (void *)(long)skb->data;
	c.data_end = (void *)(long)skb->data_end;
	/* Sent by a socket of this host (forwarded packets have no socket). */
	if (hook == PP_HOOK_EGRESS && skb->sk)
		c.from_host = 1;
	return pp_parse_into(&c, hook);
}

__noinline int pp_parse_xdp(struct xdp_md *xdp, __u32 hook)
{
	struct pp_ctx c = {};

	if (!xdp)
		return PP_PARSED_BAD;
	c.ctx = xdp;
	c.data = (void *)(long)xdp->data;
	c.data_end = (void *)(long)xdp->data_end;
	c.xdp = 1;
	return pp_parse_into(&c, hook);
}

/* The pipeline of every packet hook. len is the frame's length, ifindex the interface it
 * arrived on (ingress). */
static __always_inline void pp_handle(void *ctx, int xdp, __u32 len, __u32 ifindex, __u32 hook)
{
	struct pp_counters *cnt = pp_counters_get(hook);
	__u32 zero = 0;
	struct pp_pkt *pp;
	int parsed;

	if (!cnt)
		return;
	COUNT(cnt, pkts);
	COUNT_N(cnt, bytes, len);
	parsed = xdp ? pp_parse_xdp(ctx, hook) : pp_parse(ctx, hook); /* parse, decide */
	if (parsed == PP_PARSED_BAD)
		return;
	pp = bpf_map_lookup_elem(&scratch, &zero);
	if (!pp)
		return;
	if (pp_cfg.aggregate)
		pp_count_traffic(pp, parsed == PP_PARSED_ID, len, cnt);
	if (parsed != PP_PARSED_ID)
		return;
	pp->is_ingress = hook == PP_HOOK_INGRESS;
	pp->ifindex = ifindex;
	pp->now = kedge_now();
	pp_process(ctx, pp, cnt); /* act, count */
}

/* The TC programs return TC_ACT_UNSPEC (TCX_NEXT) and the XDP one XDP_PASS: a monitor never
 * decides a packet's fate. */
SEC("tc")
int pping_egress(struct __sk_buff *skb)
{
	pp_handle(skb, 0, skb->len, 0, PP_HOOK_EGRESS);
	return TC_ACT_UNSPEC;
}

SEC("tc")
int pping_ingress(struct __sk_buff *skb)
{
	pp_handle(skb, 0, skb->len, skb->ingress_ifindex, PP_HOOK_INGRESS);
	return TC_ACT_UNSPEC;
}

/* The ingress pipeline at the XDP hook (--ingress-hook xdp): earlier than TC, before an skb
 * exists. Frames are single-buffer (no xdp.frags), so len is the whole frame. */
SEC("xdp")
int pping_xdp(struct xdp_md *ctx)
{
	__u32 len = (void *)(long)ctx->data_end - (void *)(long)ctx->data;

	pp_handle(ctx, 1, len, ctx->ingress_ifindex, PP_HOOK_INGRESS);
	return XDP_PASS;
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
	struct pp_flow_state *fs;
	struct pp_tuple key;
	struct pp_pkt_id del;
	__u64 now, life;
	int first;

	if (!id || !stored)
		return 0;
	now = kedge_now();
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
	COUNT(pp_counters_get(PP_HOOK_GC), gc_ts_expired);
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
	now = kedge_now();
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
	COUNT(cnt, gc_flow_expired);
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
