/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* delayline.h - the delay line, inside its kedge-owned namespace: clones enter through
 * dl_entry (edt: stamped with their deadline), wait in the delay device's qdisc (conveyor
 * tbf | netem | fq) and leave through dl_loop, which also keeps the conveyor's filler
 * frames going round. */
#ifndef KEDGE_HEDGE_DELAYLINE_H
#define KEDGE_HEDGE_DELAYLINE_H

#include "maps.h"
#include "request.h"

/* edt: the clone is released by fq at its deadline (skb->tstamp, CLOCK_MONOTONIC). */
static __always_inline void edt_stamp(struct __sk_buff *skb, struct dl_stats *ds)
{
	struct match m;
	struct hreq *e;

	if (!match(skb, &m, MATCH_REQUEST) || !(e = bpf_map_lookup_elem(&scoreboard, &m.key))) {
		COUNT(ds, edt_no_entry);
		return;
	}
	bpf_skb_set_tstamp(skb, e->deadline_ns, BPF_SKB_TSTAMP_DELIVERY_MONO);
	COUNT(ds, edt_set);
}

/* dl_redirect sends the packet on and counts a failed redirect (the packet is dropped). */
static __always_inline int dl_redirect(__u32 ifindex, struct dl_stats *ds)
{
	long ret = bpf_redirect(ifindex, 0);

	if (ret != TC_ACT_REDIRECT)
		COUNT(ds, redirect_errors);
	return ret;
}

/* dl_enter: a clone enters the delay device. */
static __always_inline int dl_enter(struct __sk_buff *skb)
{
	struct dl_stats *ds = dl_stats_get();

	COUNT(ds, entered);
	if (cfg.dl_backend == DL_EDT)
		edt_stamp(skb, ds);
	return dl_redirect(cfg.dl_dev_ifindex, ds);
}

/* filler_of returns the conveyor filler the frame carries, or NULL for a clone. The
 * Ethernet header goes through parse.h like every other packet. */
static __always_inline struct filler *filler_of(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct hdr_cursor nh = { .pos = data };
	struct ethhdr *eth;
	struct filler *f;
	__u8 flags = 0;

	if (parse_ethhdr(&nh, data_end, &eth, &flags) != FILLER_ETH_P)
		return NULL;
	f = pkt_hdr(data, data_end, nh.pos - data, sizeof(*f));
	if (!f || f->magic != FILLER_MAGIC)
		return NULL;
	return f;
}

/* filler_period records a filler's round trip (conveyor calibration and stats). */
static __always_inline void filler_period(struct dl_stats *ds, struct filler *f, __u64 now)
{
	__u64 period = now - f->stamp_ns;

	if (f->stamp_ns && period < 10000000000ULL) {
		ds->period_sum_ns += period;
		ds->period_count++;
		if (!ds->period_min_ns || period < ds->period_min_ns)
			ds->period_min_ns = period;
		if (period > ds->period_max_ns)
			ds->period_max_ns = period;
	}
	ds->filler_passes++;
}

/* dl_exit: a clone that has served its time goes back towards the rescuer; a conveyor
 * filler goes round again, unless user space asked for fewer (dl_ctl). */
static __always_inline int dl_exit(struct __sk_buff *skb)
{
	struct dl_stats *ds = dl_stats_get();
	struct filler *f = filler_of(skb);
	struct dl_ctl *ctl;
	__u32 zero = 0;
	__u64 now;

	if (!f) {
		COUNT(ds, exited);
		return dl_redirect(cfg.dl_peer_ifindex, ds);
	}
	ctl = bpf_map_lookup_elem(&dl_control, &zero);
	if (ctl && ctl->stop) {
		COUNT(ds, fillers_dropped);
		return TC_ACT_SHOT;
	}
	if (ctl && ctl->fillers_to_drop > 0) {
		if (__sync_fetch_and_add(&ctl->fillers_to_drop, -1) > 0) {
			COUNT(ds, fillers_dropped);
			return TC_ACT_SHOT;
		}
		__sync_fetch_and_add(&ctl->fillers_to_drop, 1); /* lost a race: undo */
	}
	now = bpf_ktime_get_ns();
	if (ds)
		filler_period(ds, f, now);
	f->stamp_ns = now;
	return dl_redirect(cfg.dl_dev_ifindex, ds);
}

#endif /* KEDGE_HEDGE_DELAYLINE_H */
