/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* pass.h - what comes out of a pass through the delay device (TC ingress of its peer): a due
 * tick (or any carried packet) leaves towards the consumer; a tick not yet due goes round
 * again (on the conveyor without fillers resized for what is left of its wait); a tick that is
 * no longer the armed one is dropped; a conveyor filler goes round again, and may deliver a
 * due tick itself (piggyback). */
#ifndef KEDGE_PACER_PASS_H
#define KEDGE_PACER_PASS_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "clock.h"
#include "counters.h"
#include "pacer_client.h"
#include "frame.h"

/* A filler round trip longer than this is a stamp from before a pause, not a period. */
#define PACER_PERIOD_MAX_NS 10000000000ULL

/* The conveyor's filler control (array, one slot), written by user space
 * (internal/pacer: calibration shrinks the queue, Close stops it). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pacer_ctl);
} pacer_control SEC(".maps");

/* pacer_piggyback: with fillers in the queue (carry on the conveyor) a tick frame waits a
 * whole period behind them, so every filler pass also looks at the armed deadline and,
 * when it is due and not yet fired, delivers the tick itself: the filler is rewritten into
 * a tick frame, cloned out of the peer and restored. Ticks then have the filler spacing's
 * precision (filler_bytes*8/rate) instead of the period's. */
static __always_inline void pacer_piggyback(struct __sk_buff *skb, struct pacer_stats *ps, __u64 now)
{
	struct pacer_state *st = pacer_state_get();
	struct pacer_tick t = { .magic = PACER_TICK_MAGIC };
	__u8 head[PACER_FILLER_HEAD];
	__u64 armed, fired;

	if (!st)
		return;
	armed = st->armed_ns;
	fired = st->fired_ns;
	if (!armed || fired == armed || !pacer_due(armed, now, 0))
		return;
	if (__sync_val_compare_and_swap(&st->fired_ns, fired, armed) != fired)
		return; /* another CPU's filler fired it */
	t.deadline_ns = armed;
	t.sent_ns = now;
	t.seq = st->seq;
	if (bpf_skb_load_bytes(skb, 0, head, sizeof(head)) < 0 || pacer_write_tick(skb, &t) < 0 ||
	    bpf_clone_redirect(skb, pacer_cfg.peer_ifindex, 0) < 0) {
		st->fired_ns = fired; /* the queued tick frame still serves */
		COUNT(ps, tick_build_errors);
	} else {
		COUNT(ps, ticks_piggybacked);
	}
	if (bpf_skb_store_bytes(skb, 0, head, sizeof(head), 0) < 0)
		COUNT(ps, tick_build_errors); /* the filler is lost at its next pass */
}

/* pacer_filler_pass keeps a conveyor filler going round, unless user space asked for fewer,
 * and records its round trip (the conveyor's calibration). */
static __always_inline int pacer_filler_pass(struct __sk_buff *skb, struct pacer_filler *f,
					     struct pacer_stats *ps)
{
	struct pacer_ctl *ctl;
	__u32 zero = 0;
	__u64 now, period;

	ctl = bpf_map_lookup_elem(&pacer_control, &zero);
	if (ctl && ctl->stop) {
		COUNT(ps, fillers_dropped);
		return TC_ACT_SHOT;
	}
	if (ctl && ctl->fillers_to_drop > 0) {
		if (__sync_fetch_and_add(&ctl->fillers_to_drop, -1) > 0) {
			COUNT(ps, fillers_dropped);
			return TC_ACT_SHOT;
		}
		__sync_fetch_and_add(&ctl->fillers_to_drop, 1); /* lost a race: undo */
	}
	now = kedge_now();
	if (ps) {
		period = now - f->stamp_ns;
		if (f->stamp_ns && period < PACER_PERIOD_MAX_NS) {
			ps->period_sum_ns += period;
			ps->period_count++;
			if (!ps->period_min_ns || period < ps->period_min_ns)
				ps->period_min_ns = period;
			if (period > ps->period_max_ns)
				ps->period_max_ns = period;
		}
		ps->filler_passes++;
	}
	f->stamp_ns = now;
	pacer_piggyback(skb, ps, now);
	return pacer_redirect(pacer_cfg.dev_ifindex, ps);
}

/* pacer_tick_resize (conveyor without fillers): a tick frame alone in tbf passes once per
 * its own transmission time, so a frame of tick_bytes goes round every Resolution however far
 * its deadline is (10k passes a second at 100 us, each a veth crossing and a softirq). Sized
 * for its next pass to the bytes that take what is left (left_ns at rate_bytes), between
 * PACER_TICK_MIN_BYTES and tick_max_bytes, a far tick takes a few long passes and lands near
 * its deadline in a last short one. A frame that comes back early (tbf's bucket had tokens
 * to spare) is resized again for what is still left. */
static __always_inline void pacer_tick_resize(struct __sk_buff *skb, struct pacer_stats *ps, __u64 left_ns)
{
	__u64 want = left_ns / 1000 * pacer_cfg.rate_bytes / 1000000;

	if (want > pacer_cfg.tick_max_bytes)
		want = pacer_cfg.tick_max_bytes;
	if (want < PACER_TICK_MIN_BYTES)
		want = PACER_TICK_MIN_BYTES;
	if (want != skb->len && bpf_skb_change_tail(skb, want, 0) < 0)
		COUNT(ps, tick_trim_errors); /* the frame keeps its length: only less precise */
}

/* after_pass (pacer_pass): a due tick (or any carried packet) leaves towards the consumer; a tick not yet
 * due goes round again; a tick that is no longer the armed one is dropped (the earlier tick
 * armed after it serves). */
static __always_inline int after_pass(struct __sk_buff *skb)
{
	struct pacer_stats *ps = pacer_stats_get();
	struct pacer_state *st;
	struct pacer_filler *fl;
	struct pacer_tick *t;
	int is_tick;
	__u64 now;

	t = pacer_tick_of(skb, &is_tick);
	if (is_tick) {
		if (!t) {
			COUNT(ps, malformed_ticks);
			return TC_ACT_SHOT;
		}
		st = pacer_state_get();
		if (st && (st->armed_ns != t->deadline_ns || st->fired_ns == t->deadline_ns)) {
			COUNT(ps, ticks_superseded);
			return TC_ACT_SHOT;
		}
		now = kedge_now();
		if (pacer_cfg.backend != PACER_EDT && !pacer_due(t->deadline_ns, now, 0)) {
			t->passes++;
			COUNT(ps, tick_passes);
			if (pacer_cfg.tick_max_bytes)
				pacer_tick_resize(skb, ps, t->deadline_ns - now);
			return pacer_redirect(pacer_cfg.dev_ifindex, ps);
		}
		return pacer_redirect(pacer_cfg.peer_ifindex, ps);
	}
	fl = pacer_filler_of(skb);
	if (fl)
		return pacer_filler_pass(skb, fl, ps);
	COUNT(ps, carried_out);
	return pacer_redirect(pacer_cfg.peer_ifindex, ps);
}

#endif /* KEDGE_PACER_PASS_H */
