/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* tick.h - the rescuer (hedge_rescue, the pacer's tick program at TC ingress of its veth):
 * what the pacer hands back.
 *   a tick     store_tick pops every due stored request of every service (tick_one) and
 *              hedges each (store_hedge -> send.h); the tick's skb becomes the last hedge,
 *              the ones before it are cloned back in (hedge_flush); the next tick is asked
 *              for the earliest request still waiting
 *   a clone    back from the delay line (rescue_clone): not due -> round again; due ->
 *              hedged (send.h) and sent
 *   a hedge    a tick cloned back in: leaves for its replica (rescue_hedge)
 * Hedges leave by bpf_redirect_neigh (the neighbour table fills in the L2 addresses): a clone
 * has no neighbour resolution of its own, and bpf_fib_lookup answers only where forwarding is
 * enabled, which a client's namespace need not have. */
#ifndef KEDGE_HEDGE_TICK_H
#define KEDGE_HEDGE_TICK_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "clock.h"
#include "counters.h"
#include "hedge.h"
#include "maps.h"
#include "budget.h"
#include "match.h"
#include "store.h"
#include "send.h"
#include "pacer_client.h"

/* Cells one tick pops at most (hedges sent: TICK_HEDGES_MAX of them), besides a look at each
 * service's head; more are left to a next tick asked for at once (tick_more). */
#define TICK_POPS_MAX 256

/* What one tick's loop works with: the skb on the stack, the time and the state it changes
 * in a per-CPU map value (tick_state, maps.h). On the stack, older verifiers (6.1) take the
 * values the callback's one simulated pass leaves there for constants and hard-wire the
 * branches that test them (the flush of a held hedge was dropped as dead code); a map
 * value's contents are unknown to them. Ticks run in softirq and do not nest on a CPU. */
struct tick_ctx {
	struct __sk_buff *skb;
	struct tick_state *st;
};

/* store_hedge hedges cell idx of service svc's ring, popped by the rescuer (send.h): skipped
 * (answered in its cell or in the scoreboard, orphaned, overdue, refused) or built into the
 * skb for the caller to send. A pending request was moved into the scoreboard before the pop
 * (store_move), so its entry decides.
 * Returns enum hedge_verdict. A global function: the verifier checks it once, on its own,
 * not once per state of the tick's loop. */
__attribute__((noinline)) int store_hedge(struct __sk_buff *skb, __u32 svc, __u32 idx, __u64 now)
{
	struct hstore *c = bpf_map_lookup_elem(&store_ring, &idx);
	struct store_lap *l = bpf_map_lookup_elem(&store_laps, &idx);
	struct hedge_ctx h = { .svc = svc, .now = now };

	h.cfg = bpf_map_lookup_elem(&svc_cfgs, &svc);
	h.st = bpf_map_lookup_elem(&svc_states, &svc);
	h.cnt = stats_for(svc);
	if (!c || !l || !h.cfg || !h.st || !c->len)
		return HEDGE_DROPPED;
	switch (READ_ONCE(l->lap) & LAP_STATE_MASK) {
	case LAP_ANSWERED: /* answered in its cell: it never entered the scoreboard */
		budget_release(h.cfg, h.st);
		COUNT(h.cnt, stored_answered);
		return HEDGE_DROPPED;
	case LAP_MOVED:
		break;
	default: /* not moved: its scoreboard entry could not be written (store_move) */
		budget_release(h.cfg, h.st);
		return HEDGE_DROPPED;
	}
	h.e = bpf_map_lookup_elem(&scoreboard, &c->key);
	if (!h.e || h.e->sent_ns != c->sent_ns) {
		budget_release(h.cfg, h.st);
		COUNT(h.cnt, stored_orphaned);
		return HEDGE_DROPPED;
	}
	h.key = &c->key;
	h.c = c;
	h.deadline = c->deadline_ns;
	h.delay = c->delay_ns;
	if (!hedge_wanted(&h))
		return HEDGE_DROPPED;
	return hedge_decide(skb, &h);
}

/* hedge_flush sends the hedge the skb holds on: cloned into the pacer veth's ingress, where
 * the rescuer (rescue_hedge) gives it to bpf_redirect_neigh, so that the skb can take the
 * next hedge. */
static __always_inline void hedge_flush(struct __sk_buff *skb)
{
	if (bpf_clone_redirect(skb, pacer_cfg.ifindex, BPF_F_INGRESS) < 0)
		COUNT(stats_global(), tick_send_errors);
	else
		COUNT(stats_global(), hedges_reinjected);
}

/* tick_cell: tick_one's work on ring (service svc's store or park ring), whose tick flag the
 * caller holds. */
static __always_inline long tick_cell(struct tick_ctx *c0, struct tick_state *t, struct store_pos *sp, __u32 ring,
				      __u32 svc)
{
	struct store_lap *l;
	struct hstore *c;
	__u32 s;
	__u64 h;
	int r;

	h = READ_ONCE(sp->head);
	c = ring_cell(ring, h);
	l = ring_lap(ring, h);
	s = l ? lap_state(READ_ONCE(l->lap), h) : LAP_EMPTY;
	if (!c || s == LAP_EMPTY) {
		t->ring++; /* empty (or a splitter is still filling the head: it asks for a tick) */
		return 0;
	}
	if (!pacer_due(c->deadline_ns, t->now, 0) && cell_waits(c, s)) {
		if (!t->next || c->deadline_ns < t->next)
			t->next = c->deadline_ns;
		t->ring++;
		return 0;
	}
	/* Due, or done with before its deadline (answered out of order, evicted): popped now,
	 * so that the next tick is asked for the first request that still waits. */
	if (t->sent >= TICK_HEDGES_MAX) {
		t->more = 1; /* this tick sent its share: the next one at once */
		return 1;
	}
	/* A pending request enters the scoreboard while its cell is still the head, where a
	 * response looks for it (store.h). */
	if (s == LAP_PENDING)
		store_move(svc, h); /* only a store ring holds pending cells */
	if (__sync_val_compare_and_swap(&sp->head, h, h + 1) != h)
		return 0; /* a response popped it: look again */
	if (t->held) {
		hedge_flush(c0->skb);
		t->held = 0;
	}
	r = store_hedge(c0->skb, svc, ring * STORE_RING + (__u32)(h & (STORE_RING - 1)), t->now);
	ring_release(ring, h);
	if (r == HEDGE_BUILT) {
		t->held = 1;
		t->sent++;
	}
	return 0;
}

/* tick_one (bpf_loop callback): pops one due cell of ring t->ring (the store rings, then the
 * park rings: store.h) and handles it, or moves on to the next ring when its head is empty
 * or not due. One tick at a time works on a ring (store_pos.ticking): a tick that finds
 * another at it leaves the ring to that one. */
static long tick_one(__u32 i, struct tick_ctx *c0)
{
	struct tick_state *t = c0->st;
	struct store_pos *sp;
	__u32 ring, svc;
	long ret;

	if (!t)
		return 1;
	ring = t->ring;
	if (ring >= 2 * cfg.store_rings || ring >= 2 * SVC_MAX)
		return 1;
	svc = ring < cfg.store_rings ? ring : ring - cfg.store_rings;
	sp = bpf_map_lookup_elem(&store_heads, &ring);
	if (!sp)
		return 1;
	if (READ_ONCE(sp->head) == READ_ONCE(sp->tail)) {
		t->ring++; /* empty */
		return 0;
	}
	if (__sync_val_compare_and_swap(&sp->ticking, 0, 1) != 0) {
		/* Another tick at it, or a response parking its head (store_park), which asks
		 * for no tick: the next tick comes at once and looks again. */
		t->more = 1;
		t->ring++;
		return 0;
	}
	ret = tick_cell(c0, t, sp, ring, svc);
	__sync_lock_test_and_set(&sp->ticking, 0);
	return ret;
}

/* tick_rearm asks the pacer for the tick at next. Not inlined: pacer_request's compare-and-
 * exchange loop keeps values across its helper calls, and their spills would sit in
 * hedge_rescue's own frame, the first of every call chain the verifier adds up (maps.h,
 * struct tick_state); this frame is a leaf beside them. */
static __noinline int tick_rearm(struct __sk_buff *skb, __u64 next)
{
	return pacer_request(skb, next);
}

/* store_tick (rescuer, a pacer tick): sends every due stored request's hedge and asks for
 * the next tick. Returns the TC verdict for the tick's skb. */
static __always_inline int store_tick(struct __sk_buff *skb)
{
	struct tick_ctx c = { .skb = skb };
	struct tick_state *t = tick_state_get();
	long ret;

	COUNT(stats_global(), pacer_ticks);
	if (!t)
		return TC_ACT_SHOT;
	__builtin_memset(t, 0, sizeof(*t));
	c.st = t;
	t->now = kedge_now();
	bpf_loop(2 * SVC_MAX + TICK_POPS_MAX, tick_one, &c, 0);
	if (t->ring < 2 * cfg.store_rings)
		t->more = 1; /* the loop ran out, or stopped at TICK_HEDGES_MAX */
	if (t->more) {
		COUNT(stats_global(), tick_more);
		t->next = t->now;
	}
	if (t->next)
		tick_rearm(skb, t->next);
	if (!t->held)
		return TC_ACT_SHOT;
	ret = bpf_redirect_neigh(cfg.out_ifindex, NULL, 0, 0);
	if (ret != TC_ACT_REDIRECT)
		COUNT(stats_global(), tick_send_errors);
	return ret;
}

/* rescue_hedge: a hedge a tick cloned back in (hedge_flush) leaves for its replica. */
static __always_inline int rescue_hedge(struct __sk_buff *skb)
{
	long ret = bpf_redirect_neigh(cfg.out_ifindex, NULL, 0, 0);

	if (ret != TC_ACT_REDIRECT)
		COUNT(stats_global(), tick_send_errors);
	return ret;
}

/* clone_delay: the delay the clone's entry waits: from the request's send time for the
 * first hedge, from the last hedge's for a further one (max_hedges). */
static __always_inline __u64 clone_delay(const struct hreq *e)
{
	__u64 from = e->hedges_sent ? e->hedged_ns : e->sent_ns;

	return e->deadline_ns > from ? e->deadline_ns - from : 0;
}

/* rescue_clone (a carried clone back from the delay line): dropped when its request was
 * answered (or has had its hedges), sent round again when not due yet, else hedged (send.h)
 * and sent. Not inlined: its stack frame stays off the tick path's call chain, which the
 * verifier adds up. */
static __noinline int rescue_clone(struct __sk_buff *skb)
{
	struct hedge_ctx h = {};
	struct match m;
	long ret;

	if (!match(skb, &m, MATCH_REQUEST)) {
		/* Nothing but clones of hedged requests arrive here; anything else is dropped. */
		COUNT(stats_global(), rescue_unmatched);
		return TC_ACT_SHOT;
	}
	h.e = bpf_map_lookup_elem(&scoreboard, &m.key);
	if (!h.e) {
		budget_release(m.cfg, m.st);
		COUNT(m.cnt, clones_orphaned);
		return TC_ACT_SHOT;
	}
	h.key = &m.key;
	h.cfg = m.cfg;
	h.st = m.st;
	h.cnt = m.cnt;
	h.svc = m.svc;
	h.m = &m;
	if (!hedge_wanted(&h))
		return TC_ACT_SHOT;
	h.now = kedge_now();
	h.deadline = h.e->deadline_ns;
	if (!pacer_due(h.deadline, h.now, 1)) {
		ret = pacer_recirculate(skb, h.deadline);
		if (ret != TC_ACT_REDIRECT) {
			hedge_give_up(&h, REQ_NOHEDGE);
			COUNT(m.cnt, redirect_errors);
			return TC_ACT_SHOT;
		}
		COUNT(m.cnt, recirculations);
		return ret;
	}
	h.delay = clone_delay(h.e);
	if (hedge_decide(skb, &h) != HEDGE_BUILT)
		return TC_ACT_SHOT;
	/* bpf_redirect_neigh without parameters or flags does not fail; counted if it did. */
	ret = bpf_redirect_neigh(cfg.out_ifindex, NULL, 0, 0);
	if (ret != TC_ACT_REDIRECT)
		COUNT(m.cnt, redirect_errors);
	return ret;
}

/* rescue (the pacer's tick program): a tick sends the stored path's due hedges
 * (store.h), a carried packet is the clone path's. */
static __always_inline int rescue(struct __sk_buff *skb)
{
	struct pacer_tick tick;

	switch (pacer_receive(skb, &tick)) {
	case PACER_RX_TICK:
		return store_tick(skb);
	case PACER_RX_MALFORMED:
		return TC_ACT_SHOT; /* counted by the pacer */
	}
	/* A hedge a tick cloned back in keeps its mark (same namespace); clones from the pacer
	 * namespace lose theirs crossing the veth. */
	if (skb->mark == cfg.hedge_mark)
		return rescue_hedge(skb);
	return rescue_clone(skb);
}

#endif /* KEDGE_HEDGE_TICK_H */
