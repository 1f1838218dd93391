/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* enter.h - what enters the pacer (TC ingress of both peers in the pacer namespace): a tick
 * request becomes a tick frame for the earliest armed deadline; a carried packet goes into the
 * delay device as it came (edt: with the delivery time its consumer gave it, pacer_carry). */
#ifndef KEDGE_PACER_ENTER_H
#define KEDGE_PACER_ENTER_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "clock.h"
#include "counters.h"
#include "pacer_client.h"
#include "frame.h"

/* pacer_build_tick turns a tick request into a tick frame for the earliest armed deadline. */
static __always_inline int pacer_build_tick(struct __sk_buff *skb, struct pacer_stats *ps)
{
	struct pacer_state *st = pacer_state_get();
	struct pacer_tick t = { .magic = PACER_TICK_MAGIC };
	__u64 now = kedge_now();

	if (!st)
		return TC_ACT_SHOT;
	t.deadline_ns = st->armed_ns;
	if (!t.deadline_ns)
		t.deadline_ns = now; /* delivered meanwhile: this one goes at once, harmlessly */
	t.sent_ns = now;
	t.seq = st->seq;
	if (bpf_skb_change_tail(skb, pacer_cfg.tick_bytes, 0) < 0)
		COUNT(ps, tick_trim_errors);
	if (pacer_write_tick(skb, &t) < 0) {
		__sync_val_compare_and_swap(&st->armed_ns, t.deadline_ns, 0);
		COUNT(ps, tick_build_errors);
		return TC_ACT_SHOT;
	}
	if (pacer_cfg.backend == PACER_EDT)
		bpf_skb_set_tstamp(skb, t.deadline_ns, BPF_SKB_TSTAMP_DELIVERY_MONO);
	COUNT(ps, ticks_entered);
	return pacer_redirect(pacer_cfg.dev_ifindex, ps);
}

/* enter (pacer_enter): tick requests (from the tick veth) become tick frames; carried packets go
 * into the delay device. Which veth a packet came through tells them apart: skb fields such
 * as mark and priority do not survive the veth into another namespace, and the clone's bytes
 * are the consumer's. */
static __always_inline int enter(struct __sk_buff *skb)
{
	struct pacer_stats *ps = pacer_stats_get();

	if (skb->ifindex == pacer_cfg.tick_peer_ifindex)
		return pacer_build_tick(skb, ps);
	if (skb->ifindex != pacer_cfg.peer_ifindex) {
		COUNT(ps, foreign);
		return TC_ACT_SHOT;
	}
	COUNT(ps, carried_in);
	return pacer_redirect(pacer_cfg.dev_ifindex, ps);
}

#endif /* KEDGE_PACER_ENTER_H */
