// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* sg.bpf.c - kedge's scatter-gather data plane. Entry points:
 *   sg_scatter      (TC egress, coordinator iface)  one request -> a copy per worker (bpf_loop)
 *   sg_scatter_cont (TC ingress, coordinator iface)  the next batch of a large fan-out
 *   sg_scatter_bl, sg_scatter_cont_bl (same, kernels without bpf_loop: a bounded loop)
 *   sg_gather       (XDP, coordinator iface)        replies reduced and consumed
 *   sg_timers_init  (BPF_PROG_TEST_RUN)             one bpf_timer per slot
 *   sg_sweep        (BPF_PROG_TEST_RUN)             expiry on kernels without bpf_timer
 *   sg_resend       (TC ingress, the pacer's veth)  re-sends: a pacer tick sends the due
 *                                                   rounds of stored requests (bpf_loop tier)
 * The wire format and the contract with user space are in bpf/include/sg.h. The stages:
 * scatter.h (a request becomes a copy per worker), gather.h (a whole reply is reduced),
 * parts.h (a part of a multi-packet reply is reduced), reply.h (what the two share),
 * expire.h (a request past its deadline completes), stored.h and resend.h (a request's
 * copies sent again to workers that have not answered); maps.h holds the config and maps. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "counters.h"
#include "sg.h"
#include "maps.h"
#include "expire.h"
#include "scatter.h"
#include "gather.h"
#include "resend.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

SEC("tc")
int sg_scatter(struct __sk_buff *skb)
{
	struct scatter_ctx c;
	struct loop_ctx l = { .skb = skb, .c = &c };
	int ret = scatter_prepare(skb, &c, 1);

	if (ret != 1)
		return ret;
	if (c.resend) /* before the first copy rewrites the request */
		stored_request(skb, c.gid, c.slot, c.id, c.l4_off);
	bpf_loop(SG_WORKERS_MAX, scatter_cb, &l, 0);
	return scatter_finish(skb, &c);
}

/* TC ingress of the group interface: the next batch of a request handed on by
 * scatter_finish (fan-outs larger than sg_cfg.batch). Everything else passes. */
SEC("tc")
int sg_scatter_cont(struct __sk_buff *skb)
{
	struct scatter_ctx c;
	struct loop_ctx l = { .skb = skb, .c = &c };
	int ret = cont_prepare(skb, &c);

	if (ret != 1)
		return ret;
	bpf_loop(SG_WORKERS_MAX, scatter_cb, &l, 0);
	return scatter_finish(skb, &c);
}

/* Kernels before 5.17 (no bpf_loop, no bpf_timer): SCATTER_CHUNK workers per program
 * run in a bounded loop, then a tail call to sg_scatter_chunk for the next chunk of the
 * batch, with the loop state in a per-CPU map (a TC program runs to its end on one CPU
 * with bottom halves off; the copies' own pass through the egress hook returns before
 * touching it). A batch (sg_cfg.batch <= 32 x 33, the tail-call limit) is handed on as in
 * the bpf_loop tier. A bounded loop over all 1024 workers exceeds the verifier's
 * 1M-instruction budget. Expiry is sg_sweep's. */
#define SCATTER_CHUNK 32

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct scatter_ctx);
} scatter_state SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} scatter_chain SEC(".maps");

static __always_inline int scatter_chunk(struct __sk_buff *skb, struct scatter_ctx *c)
{
	__u32 zero = 0;
	__u32 start = c->next;

	for (__u32 k = 0; k < SCATTER_CHUNK; k++) {
		if (scatter_one(skb, start + k, c, 0))
			return scatter_finish(skb, c);
	}
	c->next = start + SCATTER_CHUNK;
	if (c->next >= c->end)
		return scatter_finish(skb, c);
	bpf_tail_call(skb, &scatter_chain, zero);
	/* Tail call failed (limit reached or not set up): count the batch's rest as failed. */
	c->errors += c->end - c->next;
	return scatter_finish(skb, c);
}

/* bounded_entry starts the first batch of a request (cont = 0) or a handed-on one. */
static __always_inline int bounded_entry(struct __sk_buff *skb, const int cont)
{
	__u32 zero = 0;
	struct scatter_ctx *c = bpf_map_lookup_elem(&scatter_state, &zero);
	int ret;

	if (!c)
		return TC_ACT_UNSPEC;
	ret = cont ? cont_prepare(skb, c) : scatter_prepare(skb, c, 0);
	if (ret != 1)
		return ret;
	return scatter_chunk(skb, c);
}

SEC("tc")
int sg_scatter_bl(struct __sk_buff *skb)
{
	return bounded_entry(skb, 0);
}

SEC("tc")
int sg_scatter_cont_bl(struct __sk_buff *skb)
{
	return bounded_entry(skb, 1);
}

SEC("tc")
int sg_scatter_chunk(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct scatter_ctx *c = bpf_map_lookup_elem(&scatter_state, &zero);

	if (!c)
		return TC_ACT_SHOT;
	return scatter_chunk(skb, c);
}

SEC("xdp")
int sg_gather(struct xdp_md *ctx)
{
	/* ctx waits on the stack for the tail call (call_user): kept in a register through
	 * the gather, it cost the verifier 18,000 more instructions (fewer registers left,
	 * more values spilled). */
	struct xdp_md *volatile saved = ctx;
	int verdict = gather(ctx);

	return verdict == GATHER_USER ? call_user(saved) : verdict;
}

/* The pacer's tick program of a coordinator whose groups re-send (resend.h). */
SEC("tc")
int sg_resend(struct __sk_buff *skb)
{
	return resend(skb);
}

/* Returns the number of slots whose timer could not be set up; run until it is 0. */
SEC("tc")
int sg_timers_init(struct __sk_buff *skb)
{
	__u32 failed = 0;

	bpf_loop(SG_SLOTS, timer_init_cb, &failed, 0);
	return failed;
}

/* Expires every pending slot past its deadline; returns how many it expired. */
SEC("tc")
int sg_sweep(struct __sk_buff *skb)
{
	__u64 now = bpf_ktime_get_ns();
	__u32 expired = 0;

	COUNT(stats_for(NO_GROUP), sweeps);
	for (__u32 i = 0; i < SG_SLOTS; i++) {
		__u32 key = i;
		struct sg_slot *s = bpf_map_lookup_elem(&slots, &key);

		if (s && expire_slot(s, now))
			expired++;
	}
	return expired;
}
