/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* pacer_client.h - a consumer's side of kedge's pacer (docs/pacer.md): ask for a tick at a
 * deadline, carry a packet until its deadline, receive what the pacer hands back, tell
 * whether something is due. The pacer runs its own programs (bpf/pacer/pacer.bpf.c) from its
 * own object; this header never calls the consumer, and the consumer defines nothing for it.
 *
 * A consumer includes this header once per object. It declares what the consumer shares with
 * the pacer: the read-only pacer_cfg and the maps pacer_arming (struct pacer_state) and
 * pacer_counters (struct pacer_stats). internal/pacer fills them in at load
 * (Pacer.Client().Bind writes pacer_cfg and replaces both maps with the pacer's own), so the
 * consumer's Go code writes no glue. Loaded without a pacer (a BPF_PROG_TEST_RUN fixture) the
 * object keeps its own copies of the maps.
 *
 *   consumer netns               pacer netns (internal/pacer)
 *   any TC program:
 *     pacer_request(skb, t) --clone--> tick veth --> pacer_enter: tick frame held until t
 *     pacer_carry(skb, t)   --clone--> veth ------> pacer_enter: the packet, one pass
 *   tick program (TC ingress of the pacer's veth, attached by internal/pacer):
 *     pacer_receive(skb, &tick) first: PACER_RX_TICK / PACER_RX_CARRIED / PACER_RX_MALFORMED;
 *     then the skb is the consumer's to rewrite, clone, redirect or drop;
 *     pacer_due(deadline, now, carried), pacer_recirculate(skb, t) for a carried packet not due.
 *
 * The deadline of a carried packet travels with it: on edt it is the clone's delivery time
 * (skb->tstamp, CLOCK_MONOTONIC), which fq on the pacer's device honours; on netem and the
 * conveyor a pass is fixed and the consumer checks pacer_due when the packet is back.
 * Everything here runs in TC (sched_cls) programs only. */
#ifndef KEDGE_PACER_CLIENT_H
#define KEDGE_PACER_CLIENT_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "clock.h"
#include "counters.h"
#include "parse.h"
#include "pacer.h"

/* Set before load by internal/pacer (the pacer's own object and every consumer's). */
const volatile struct pacer_config pacer_cfg = {};

/* The pacer's maps, shared: one definition here, so the consumer's and the pacer's always
 * match (a map replacement checks type, sizes and flags). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pacer_state);
} pacer_arming SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pacer_stats);
} pacer_counters SEC(".maps");

static __always_inline struct pacer_stats *pacer_stats_get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&pacer_counters, &zero);
}

static __always_inline struct pacer_state *pacer_state_get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&pacer_arming, &zero);
}

/* pacer_request asks for a tick at deadline_ns (CLOCK_MONOTONIC, bpf_ktime_get_ns()). skb is
 * any packet the calling TC program holds; it is cloned (into the tick veth) only when a
 * tick has to be armed, and not changed. Returns enum pacer_req. */
static __always_inline int pacer_request(struct __sk_buff *skb, __u64 deadline_ns)
{
	struct pacer_state *st = pacer_state_get();
	struct pacer_stats *ps = pacer_stats_get();
	__u64 now = kedge_now(), armed = 0;
	int claimed = 0;

	if (!st)
		return PACER_ERR;
	COUNT(ps, ticks_requested);
	if (!deadline_ns)
		deadline_ns = now; /* 0 means "none" in pacer_state */
	for (int i = 0; i < PACER_REQUEST_TRIES; i++) {
		armed = st->armed_ns;
		if (armed && armed <= deadline_ns && now < armed + pacer_cfg.lost_ns) {
			COUNT(ps, ticks_coalesced);
			return PACER_COALESCED;
		}
		if (__sync_val_compare_and_swap(&st->armed_ns, armed, deadline_ns) == armed) {
			claimed = 1;
			break;
		}
	}
	if (!claimed) { /* other CPUs kept arming: one of them holds a tick near ours */
		COUNT(ps, ticks_coalesced);
		return PACER_COALESCED;
	}
	if (armed && now >= armed + pacer_cfg.lost_ns)
		COUNT(ps, ticks_lost);
	if (bpf_clone_redirect(skb, pacer_cfg.tick_ifindex, 0) < 0) {
		/* Give the slot back to the tick that held it (if any is still in flight). */
		__sync_val_compare_and_swap(&st->armed_ns, deadline_ns, armed);
		COUNT(ps, arm_errors);
		return PACER_ERR;
	}
	if (st->fired_ns == deadline_ns)
		st->fired_ns = 0; /* a new tick for a deadline a filler pass delivered before */
	__sync_fetch_and_add(&st->seq, 1);
	COUNT(ps, ticks_armed);
	return PACER_ARMED;
}

/* pacer_stamp (edt) gives skb the delivery time deadline_ns. The time is a monotonic
 * delivery time, which the kernel keeps across the veth into the pacer's namespace and the
 * pacer's redirect onto its fq device (Linux 5.18+, as bpf_skb_set_tstamp itself). 1: stamped;
 * 0: not (no deadline given, or not an IP packet: bpf_skb_set_tstamp refuses those). */
static __always_inline int pacer_stamp(struct __sk_buff *skb, __u64 deadline_ns)
{
	return deadline_ns && bpf_skb_set_tstamp(skb, deadline_ns, BPF_SKB_TSTAMP_DELIVERY_MONO) == 0;
}

static __always_inline void pacer_count_stamp(int stamped)
{
	struct pacer_stats *ps = pacer_stats_get();

	if (stamped)
		COUNT(ps, edt_set);
	else
		COUNT(ps, edt_no_deadline);
}

/* pacer_restore_tstamp puts back a time pacer_carry replaced: a delivery time (monotonic, or
 * TAI on Linux 6.11+) through the helper, a receive time (or none) by clearing the type and
 * writing the value as it was. */
static __always_inline void pacer_restore_tstamp(struct __sk_buff *skb, __u64 tstamp, __u32 type)
{
	if (type != BPF_SKB_TSTAMP_UNSPEC && tstamp) {
		bpf_skb_set_tstamp(skb, tstamp, type);
		return;
	}
	bpf_skb_set_tstamp(skb, 0, BPF_SKB_TSTAMP_UNSPEC);
	skb->tstamp = tstamp;
}

/* pacer_carry clones skb into the pacer as a carried packet, due at deadline_ns (0: none
 * known). It comes back to the tick program after one pass: on edt at its deadline (the
 * clone's delivery time; skb itself leaves with the time it had), elsewhere after the
 * backend's pass. Returns 0 or bpf_clone_redirect's negative error. */
static __always_inline long pacer_carry(struct __sk_buff *skb, __u64 deadline_ns)
{
	__u64 tstamp;
	__u32 type;
	long ret;
	int stamped;

	if (pacer_cfg.backend != PACER_EDT)
		return bpf_clone_redirect(skb, pacer_cfg.ifindex, 0);
	tstamp = skb->tstamp;
	type = skb->tstamp_type;
	stamped = pacer_stamp(skb, deadline_ns);
	ret = bpf_clone_redirect(skb, pacer_cfg.ifindex, 0);
	if (stamped)
		pacer_restore_tstamp(skb, tstamp, type);
	if (ret >= 0)
		pacer_count_stamp(stamped);
	return ret;
}

/* pacer_recirculate sends a carried packet (received by the tick program) round again, due
 * at deadline_ns (edt: its new delivery time); returns the TC verdict (TC_ACT_REDIRECT, or
 * TC_ACT_SHOT when the redirect failed). */
static __always_inline int pacer_recirculate(struct __sk_buff *skb, __u64 deadline_ns)
{
	struct pacer_stats *ps;
	long ret;

	if (pacer_cfg.backend == PACER_EDT)
		pacer_count_stamp(pacer_stamp(skb, deadline_ns));
	ret = bpf_redirect(pacer_cfg.ifindex, 0);
	if (ret != TC_ACT_REDIRECT)
		return TC_ACT_SHOT;
	ps = pacer_stats_get();
	COUNT(ps, carried_recirculated);
	return ret;
}

/* pacer_due: deadline has come, give or take half a pass (carried: 1, tick: 0). */
static __always_inline int pacer_due(__u64 deadline_ns, __u64 now, int carried)
{
	return now + (carried ? pacer_cfg.carry_early_ns : pacer_cfg.early_ns) >= deadline_ns;
}

/* pacer_tick_of returns the tick frame's payload, or NULL when skb is not a tick frame
 * (*is_tick tells a tick frame with a bad payload from any other packet). */
static __always_inline struct pacer_tick *pacer_tick_of(struct __sk_buff *skb, int *is_tick)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct hdr_cursor nh = { .pos = data };
	struct ethhdr *eth;
	struct iphdr *ip;
	struct pacer_tick *t;
	__u8 flags = 0;

	*is_tick = 0;
	if (parse_ethhdr(&nh, data_end, &eth, &flags) != ETH_P_IP)
		return NULL;
	ip = pkt_hdr(data, data_end, nh.pos - data, sizeof(*ip));
	if (!ip || ip->protocol != PACER_IPPROTO || ip->saddr || ip->daddr)
		return NULL;
	*is_tick = 1;
	t = pkt_hdr(data, data_end, nh.pos - data + sizeof(*ip), sizeof(*t));
	if (ip->ihl != 5 || !t || t->magic != PACER_TICK_MAGIC)
		return NULL;
	return t;
}

static __always_inline __u32 pacer_late_bucket(__u64 us)
{
	__u32 b = 0;

	/* Plain bounded loop: bucket = bit length of us, capped. */
	for (int i = 0; i < PACER_LATE_BUCKETS - 1; i++) {
		if (!us)
			break;
		us >>= 1;
		b++;
	}
	return b;
}

static __always_inline void pacer_record_precision(struct pacer_stats *ps, __u64 now, __u64 deadline)
{
	__u32 b;

	if (!ps)
		return;
	if (now < deadline) {
		ps->early_count++;
		if (deadline - now > ps->early_max_ns)
			ps->early_max_ns = deadline - now;
		return;
	}
	ps->late_sum_ns += now - deadline;
	ps->late_count++;
	if (now - deadline > ps->late_max_ns)
		ps->late_max_ns = now - deadline;
	b = pacer_late_bucket((now - deadline) / 1000);
	barrier_var(b);
	if (b < PACER_LATE_BUCKETS)
		ps->late_hist[b]++;
}

/* pacer_receive: the first call of the consumer's tick program. For a tick it copies the
 * payload to *t, marks the tick delivered (the consumer must request its next tick for
 * whatever is still pending), records its precision and clears the skb's delivery time.
 * Returns enum pacer_rx; the skb is the consumer's to rewrite and send, or to drop. */
static __always_inline int pacer_receive(struct __sk_buff *skb, struct pacer_tick *t)
{
	struct pacer_stats *ps = pacer_stats_get();
	struct pacer_state *st = pacer_state_get();
	struct pacer_tick *f;
	int is_tick;
	__u64 now;

	f = pacer_tick_of(skb, &is_tick);
	if (!is_tick)
		return PACER_RX_CARRIED;
	if (!f) {
		COUNT(ps, malformed_ticks);
		return PACER_RX_MALFORMED;
	}
	*t = *f;
	now = kedge_now();
	if (st && __sync_val_compare_and_swap(&st->armed_ns, t->deadline_ns, 0) != t->deadline_ns)
		COUNT(ps, ticks_stale);
	COUNT(ps, ticks_delivered);
	pacer_record_precision(ps, now, t->deadline_ns);
	/* edt's delivery time is spent: what the consumer sends goes now. Through the helper on
	 * edt (a program that reads skb->tstamp_type, as pacer_carry does, writes skb->tstamp
	 * without clearing the time's type); a plain write elsewhere (older kernels). */
	if (pacer_cfg.backend == PACER_EDT)
		bpf_skb_set_tstamp(skb, 0, BPF_SKB_TSTAMP_UNSPEC);
	else
		skb->tstamp = 0;
	return PACER_RX_TICK;
}

/* pacer_request_at is pacer_request for a caller that has read the clock in the same run:
 * now is its kedge_now(). The usual answer - a tick at or before deadline_ns is armed and not
 * lost - is decided here with the caller's time (one clock read less: ~50 ns on a virtualised
 * TSC); anything else (arming, a lost tick, a race) is pacer_request's, which reads the clock
 * itself. Same results, same counters. */
static __always_inline int pacer_request_at(struct __sk_buff *skb, __u64 deadline_ns, __u64 now)
{
	struct pacer_state *st = pacer_state_get();
	__u64 armed;

	if (st && deadline_ns) {
		armed = st->armed_ns;
		if (armed && armed <= deadline_ns && now < armed + pacer_cfg.lost_ns) {
			struct pacer_stats *ps = pacer_stats_get();

			COUNT(ps, ticks_requested);
			COUNT(ps, ticks_coalesced);
			return PACER_COALESCED;
		}
	}
	return pacer_request(skb, deadline_ns);
}

#endif /* KEDGE_PACER_CLIENT_H */
