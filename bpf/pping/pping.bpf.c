// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* pping: passive RTT monitoring in the kernel (after ePPing, xdp-project/bpf-examples).
 *
 * Two packet programs on one interface, pping_egress (TC) and pping_ingress (TC) or pping_xdp
 * (XDP, --ingress-hook xdp), run the same pipeline:
 *   parse (parse.h) -> identify (ident.h) -> timestamp the request / match the reply
 *   (flow.h) -> count (every packet lands in exactly one counter of maps.h's pp_counters).
 * A third program, pping_sockops (sock_ops, on a cgroup), reports the RTTs the kernel's TCP
 * stack measures for the host's own sockets (sockops.h).
 * Stale state is expired by user space (internal/pping/gc.go), which reads and deletes map
 * entries in batches every cleanup interval: no program runs for it.
 * The contract with user space is bpf/include/pping.h. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "clock.h"
#include "counters.h"
#include "pping.h"
#include "maps.h"
#include "flow.h"
#include "sockops.h"

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
	/* Only the flags need zeroing: parse_pkt() and pp_identify() write the rest before
	 * anything reads it. */
	__builtin_memset(&pp->f, 0, sizeof(pp->f));
	if (!pp_cfg.no_fast_path) {
		err = pp_fast_tcp(c, pp, cnt);
		if (err != PP_FAST_NO)
			return err < 0 ? PP_PARSED_IP : PP_PARSED_ID;
	}
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
		pp_count_traffic(pp, hook == PP_HOOK_INGRESS, parsed == PP_PARSED_ID, len, cnt);
	if (parsed != PP_PARSED_ID)
		return;
	pp->is_ingress = hook == PP_HOOK_INGRESS;
	pp->ifindex = ifindex;
	pp->now = 0; /* read when needed: pp_now() */
	pp->jiff = kedge_jiffies();
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

/* The kernel RTT source (sockops.h): attached to a cgroup, not to the interface. */
SEC("sockops")
int pping_sockops(struct bpf_sock_ops *skops)
{
	struct pp_counters *cnt = pp_counters_get(PP_HOOK_SOCKOPS);

	switch (skops->op) {
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		pp_sk_established(skops, cnt);
		break;
	case BPF_SOCK_OPS_RTT_CB:
		pp_sk_rtt(skops, cnt);
		break;
	}
	return 1;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
