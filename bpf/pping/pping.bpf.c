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

/* pp_fast_segment() for the program's context. */
static __always_inline int pp_shortcut(void *ctx, int xdp, __u32 hook, struct pp_counters *cnt)
{
	if (xdp) {
		struct xdp_md *x = ctx;

		return pp_fast_segment((void *)(long)x->data, (void *)(long)x->data_end, 0, cnt);
	}
	struct __sk_buff *skb = ctx;

	return pp_fast_segment((void *)(long)skb->data, (void *)(long)skb->data_end,
			       hook == PP_HOOK_EGRESS && pp_cfg.host_acks && skb->sk, cnt);
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
	if (pp_shortcut(ctx, xdp, hook, cnt))
		return;
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
	/* A pure reply (an ACK without data, an echo reply, a response) whose request direction
	 * has nothing outstanding cannot give a sample: most ACKs of a rate-limited flow. The
	 * hint says so without a flow lookup; counted like the slow path's "nothing to match",
	 * its flow's bookkeeping is not touched. */
	if (pp->f.reply_valid && !pp->f.pid_valid && !pp->f.event && !pp_cfg.no_fast_path &&
	    !pp_hint[pp_hint_slot(&pp->reply.flow)]) {
		COUNT(cnt, match_none);
		return;
	}
	pp->is_ingress = hook == PP_HOOK_INGRESS;
	pp->ifindex = ifindex;
	pp->now = 0; /* read when needed: pp_now() */
	pp->jiff = kedge_jiffies();
	/* A data segment whose TSval its direction already has, with nothing to match: the
	 * direction cache decides it without the flow table (flow.h). */
	if (!pp_cfg.no_fast_path && pp_dc_hit(pp, cnt))
		return;
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

/* One identifier of pping_gc_expire (the i-th pkt_ts key of the batch): deleted if still
 * there, and its direction's outstanding count and hint slot go down with it. Returns 1 when
 * it deleted one, 0 when not, -1 when the batch holds no i-th key. A global function like
 * pp_gc_flow(), verified once instead of once per key of the batch (inlined into the 64-key
 * loop, 6.12 processed 208k instructions for it). */
__noinline int pp_gc_id(struct __sk_buff *skb, __u32 i)
{
	struct pp_counters *cnt = pp_counters_get(PP_HOOK_GC);
	struct pp_flow_state *fs;
	struct pp_pkt_id id;
	struct pp_tuple key;
	int first;

	if (!skb || bpf_skb_load_bytes(skb, i * sizeof(id), &id, sizeof(id)) < 0)
		return -1;
	if (bpf_map_delete_elem(&pkt_ts, &id) != 0)
		return 0; /* matched since user space read it */
	first = pp_src_sorts_first(&id.flow);
	if (first)
		key = id.flow;
	else
		pp_reverse(&key, &id.flow);
	fs = bpf_map_lookup_elem(&flows, &key);
	if (fs) {
		struct pp_dir_shared *d = first ? &fs->shared[0] : &fs->shared[1];

		if (d->outstanding)
			__sync_fetch_and_add(&d->outstanding, -1);
	}
	pp_hint_add(&id.flow, -1);
	COUNT(cnt, gc_ts_expired);
	return 1;
}

/* Garbage collection of identifiers, run by user space through BPF_PROG_TEST_RUN with the
 * expired pkt_ts keys as the "packet" (up to PP_GC_BATCH of them, pp_gc_id() for each): each
 * one still there is deleted, and its direction's outstanding count and hint slot go down
 * with it - in the kernel, atomically with the packet programs, which user space could not
 * do. Returns the number deleted. */
SEC("tc")
int pping_gc_expire(struct __sk_buff *skb)
{
	__u32 n = skb->len / sizeof(struct pp_pkt_id);
	int r, done = 0;

	for (__u32 i = 0; i < PP_GC_BATCH && i < n; i++) {
		r = pp_gc_id(skb, i);
		if (r < 0)
			break;
		done += r;
	}
	return done;
}

/* Whether a direction has been idle too long (now in jiffies): unanswered after the unopened
 * lifetime, an idle ICMP/UDP one after the datagram lifetime, any after the flow lifetime.
 * internal/pping/gc.go applies the same rule to pick the candidates it hands over. */
static __always_inline int pp_dir_expired(const struct pp_dir_shared *d, __u64 last_seen,
					  __u8 proto, __u64 now)
{
	__u64 age;

	if (!pp_active(d) || now < last_seen)
		return 0;
	age = (now - last_seen) * pp_cfg.jiffy_ns;
	if (d->conn == PP_CONN_WAITOPEN && age > pp_cfg.unopened_lifetime_ns)
		return 1;
	if (proto != IPPROTO_TCP && age > pp_cfg.dgram_lifetime_ns)
		return 1;
	return age > pp_cfg.flow_lifetime_ns;
}

/* One key of pping_gc_flows (the i-th flow key of the batch, now in jiffies): a flow whose
 * directions are all closed or idle is deleted (checked again here: a packet may have revived
 * it since user space read it), its directions' cache slots emptied and those still waiting to
 * open taken off their hint slots. Returns 1 when it deleted the flow, else 0. A global
 * function, verified once: inlined into the batch's loop, its branches were walked again for
 * each of the PP_GC_FLOW_BATCH keys, and 6.12's verifier gave up after 1M instructions once
 * the direction cache had added its own. */
__noinline int pp_gc_flow(struct __sk_buff *skb, __u32 i, __u64 now)
{
	struct pp_counters *cnt = pp_counters_get(PP_HOOK_GC);
	struct pp_flow_state *fs;
	struct pp_tuple key, rev;
	int wait0, wait1;

	if (!skb || bpf_skb_load_bytes(skb, i * sizeof(key), &key, sizeof(key)) < 0)
		return 0;
	fs = bpf_map_lookup_elem(&flows, &key);
	if (!fs)
		return 0;
	/* Direction 0 runs key.saddr -> key.daddr, direction 1 the reverse; their last segments
	 * may be counted in the direction cache. */
	pp_reverse(&rev, &key);
	if ((pp_active(&fs->shared[0]) &&
	     !pp_dir_expired(&fs->shared[0], pp_dc_seen(&key, fs->own0.last_seen, now), key.proto,
			     now)) ||
	    (pp_active(&fs->shared[1]) &&
	     !pp_dir_expired(&fs->shared[1], pp_dc_seen(&rev, fs->own1.last_seen, now), key.proto,
			     now)))
		return 0;
	/* Both directions closed under the flow's lock before the delete: a packet of the flow
	 * running meanwhile on another CPU can no longer open one (and take it off its hint
	 * slot a second time), and the slots change here whether or not the delete is ours. */
	bpf_spin_lock(&fs->lock);
	wait0 = fs->shared[0].conn == PP_CONN_WAITOPEN;
	wait1 = fs->shared[1].conn == PP_CONN_WAITOPEN;
	fs->shared[0].conn = PP_CONN_CLOSED;
	fs->shared[1].conn = PP_CONN_CLOSED;
	bpf_spin_unlock(&fs->lock);
	if (wait0)
		pp_hint_add(&key, -1);
	if (wait1)
		pp_hint_add(&rev, -1);
	if (bpf_map_delete_elem(&flows, &key) != 0)
		return 0;
	pp_dc_drop(&key);
	pp_dc_drop(&rev);
	COUNT(cnt, gc_flow_expired);
	return 1;
}

/* Garbage collection of flows, run like pping_gc_expire with up to PP_GC_FLOW_BATCH flow
 * keys (pp_gc_flow() for each). Returns a bit per key: deleted. */
SEC("tc")
int pping_gc_flows(struct __sk_buff *skb)
{
	__u32 n = skb->len / sizeof(struct pp_tuple), deleted = 0;
	__u64 now = kedge_jiffies();

	/* Without a branch on the result: a verifier that tracks each bit of deleted as a
	 * known constant (6.1 does, once it has marked every scalar precise) would walk every
	 * combination of deleted keys. */
	for (__u32 i = 0; i < PP_GC_FLOW_BATCH && i < n; i++)
		deleted |= (__u32)pp_gc_flow(skb, i, now) << i;
	return deleted;
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
