/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* send.h - the hedge: one decision, written once, for a request whose hedge is due, whatever
 * its source - a clone back from the delay line (tick.h, rescue_clone: the skb is the
 * request), or a stored request popped at a pacer tick (tick.h, store_hedge: the tick's skb
 * is rebuilt from its cell):
 *
 *   hedge_wanted   answered already, or hedged as often as allowed? dropped, reservation back
 *                  (then the source's own due check: a clone not due goes round again; a cell
 *                  is popped only when due)
 *   hedge_decide   far overdue?                 not hedged that late
 *                  a replica without a copy?    none left, or every one ejected: not hedged
 *                  the budget's charge          refused: not hedged (REFUSED)
 *                  claim: state -> HEDGED       a response came first: nothing sent
 *                  a further hedge queued       (max_hedges) the clone carried again, or the
 *                                               cell copied to its ring's tail
 *                  build                        the clone's destination rewritten, or the
 *                                               tick's skb rebuilt from the cell
 *                  counted                      the skb holds the hedge: the caller sends it
 * Each refusal has its counter and leaves the request's state and the budget as its response
 * expects (docs/hedging.md, Data path). */
#ifndef KEDGE_HEDGE_SEND_H
#define KEDGE_HEDGE_SEND_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "counters.h"
#include "hedge.h"
#include "maps.h"
#include "budget.h"
#include "replica.h"
#include "timer.h"
#include "match.h"
#include "rewrite.h"
#include "store.h"
#include "events.h"
#include "pacer_client.h"

/* Far-overdue cutoff: a hedge is not sent later than deadline + max(its delay, four pacer
 * passes, OVERDUE_MIN_NS). So late, the pacer was behind (a lost tick re-armed by the
 * watchdog, a CPU that did not run softirqs): a burst of stale hedges then adds load when the
 * service can least take it, for clients that may have given up. Below the floor a hedge
 * still rescues a stalled request, whose client is still waiting. */
#define OVERDUE_MIN_NS 50000000ULL

/* far_overdue: a hedge due at deadline_ns after a delay of delay_ns is not sent at now. */
static __always_inline int far_overdue(__u64 deadline_ns, __u64 delay_ns, __u64 now)
{
	__u64 cutoff = delay_ns;

	if (cutoff < 8 * pacer_cfg.early_ns) /* early_ns is half a pass */
		cutoff = 8 * pacer_cfg.early_ns;
	if (cutoff < OVERDUE_MIN_NS)
		cutoff = OVERDUE_MIN_NS;
	return now > deadline_ns && now - deadline_ns > cutoff;
}

/* tried_of: the replicas a request has a copy at, for its first hedge the one addressed. */
static __always_inline __u32 tried_of(const struct hreq *e)
{
	if (e->tried)
		return e->tried;
	return e->orig_replica < REPLICA_MAX ? 1U << e->orig_replica : 0;
}

/* A request whose hedge is being decided, and where the hedge comes from. */
struct hedge_ctx {
	struct hreq *e;             /* its scoreboard entry */
	const struct hreq_key *key; /* and key */
	struct svc_cfg *cfg;
	struct svc_state *st;
	struct hedge_stats *cnt;
	const struct match *m;      /* source: a clone, the skb is the request; or NULL */
	struct hstore *c;           /* source: a stored request's cell (the skb is a tick's); or NULL */
	__u64 now;
	__u64 deadline;             /* when this hedge was due */
	__u64 delay;                /* how long it waited: the cutoff's, and a further hedge's wait */
	__u32 svc;
	__u32 s;                    /* the entry's state when hedge_wanted looked */
};

enum hedge_verdict {
	HEDGE_DROPPED = 0, /* nothing to send (counted why) */
	HEDGE_BUILT = 1,   /* the hedge is in the skb, claimed and counted: the caller sends it */
};

static __always_inline void count_answered(struct hedge_ctx *h)
{
	if (h->c)
		COUNT(h->cnt, stored_answered);
	else
		COUNT(h->cnt, clones_answered);
}

/* hedge_wanted: the request still wants a hedge: PENDING, or HEDGED with hedges left (HEDGED
 * and none sent yet is a claim in flight on another CPU: this copy is stale). Otherwise the
 * copy is dropped, its reservation goes back and an answered entry goes. 1: wanted. */
static __always_inline int hedge_wanted(struct hedge_ctx *h)
{
	__u32 max = h->cfg->max_hedges ? h->cfg->max_hedges : 1;
	struct hreq *e = h->e;

	h->s = READ_ONCE(e->state);
	if (h->s == REQ_PENDING || (h->s == REQ_HEDGED && e->hedges_sent && e->hedges_sent < max))
		return 1;
	if (h->s == REQ_ANSWERED)
		bpf_map_delete_elem(&scoreboard, h->key);
	budget_release(h->cfg, h->st);
	count_answered(h);
	return 0;
}

/* hedge_give_up: no hedge now, and none later: a first hedge's request becomes to (NOHEDGE:
 * its response completes it; REFUSED: the budget's, counted if it is answered late), a further
 * hedge's stays HEDGED (the earlier hedges are out). The reservation goes back, unless the
 * budget refused it (the window reserves nothing; the bucket's charge never refuses). */
static __always_inline void hedge_give_up(struct hedge_ctx *h, __u32 to)
{
	if (h->s == REQ_PENDING)
		__sync_val_compare_and_swap(&h->e->state, REQ_PENDING, to);
	if (to != REQ_REFUSED)
		budget_release(h->cfg, h->st);
}

/* hedge_unclaim: claimed and charged, but the hedge could not be built: a first hedge's
 * request goes back to NOHEDGE (a further hedge's stays HEDGED) and the charge is refunded
 * (bucket: the token goes back; window: the slot's hedge). */
static __always_inline void hedge_unclaim(struct hedge_ctx *h)
{
	if (h->s == REQ_PENDING)
		__sync_val_compare_and_swap(&h->e->state, REQ_HEDGED, REQ_NOHEDGE);
	budget_refund(h->cfg, h->st, h->now);
}

/* hedge_again queues the request for its next hedge (max_hedges), due at now + delay, on a
 * budget reservation of its own (bucket: a token, back when it comes out with nothing to
 * do): the clone carried round the delay line again, still the request as the client sent it
 * (before the rewrite), or the cell copied to its ring's tail. */
static __always_inline void hedge_again(struct __sk_buff *skb, struct hedge_ctx *h)
{
	__u64 due = h->now + h->delay;
	int err;

	if (!budget_reserve(h->cfg, h->st)) {
		COUNT(h->cnt, budget_exhausted);
		return;
	}
	if (h->c) {
		err = store_requeue(h->svc, h->c, h->now);
	} else {
		h->e->deadline_ns = due; /* the clone's deadline, read when it is back */
		err = pacer_carry(skb, due) < 0 ? -1 : 0;
	}
	if (err) {
		budget_release(h->cfg, h->st);
		COUNT(h->cnt, requeue_full);
		return;
	}
	COUNT(h->cnt, requeued);
}

/* hedge_build_from writes the hedge to replica rep into the skb: the clone's destination
 * rewritten in place, or the tick's skb rebuilt from the cell. 0 or -1. */
static __always_inline int hedge_build_from(struct __sk_buff *skb, struct hedge_ctx *h, __u32 rep)
{
	const struct svc_addr *to = replica_at(h->cfg, rep);
	struct svc_addr from;

	if (h->c)
		return hedge_build(skb, h->c, to);
	__builtin_memset(&from, 0, sizeof(from));
	from.addr = h->m->p.daddr;
	from.port = h->m->p.dport;
	return rewrite_addr(skb, &h->m->p, 1, &from, to);
}

/* hedge_decide decides, builds and counts the hedge of a wanted request that is due (see the
 * top of this file). Returns enum hedge_verdict. */
static __always_inline int hedge_decide(struct __sk_buff *skb, struct hedge_ctx *h)
{
	struct hreq *e = h->e;
	__u32 rep, tried, max = h->cfg->max_hedges ? h->cfg->max_hedges : 1;

	/* So late, the delay line was behind: the client may have given up. */
	if (far_overdue(h->deadline, h->delay, h->now)) {
		hedge_give_up(h, REQ_NOHEDGE);
		COUNT(h->cnt, overdue_dropped);
		hedge_event(HEDGE_EV_REFUSED, h->key, e, REPLICA_NONE, HEDGE_REFUSED_OVERDUE, h->now);
		return HEDGE_DROPPED;
	}
	/* A replica that does not have it yet (replica.h) ... */
	tried = tried_of(e);
	rep = pick_for(h->svc, tried, h->now);
	if (rep >= REPLICA_MAX) {
		hedge_give_up(h, REQ_NOHEDGE);
		if (rep == REPLICA_OUT) {
			COUNT(h->cnt, replicas_out); /* every candidate ejected: hedging paused */
			hedge_event(HEDGE_EV_REFUSED, h->key, e, REPLICA_NONE, HEDGE_REFUSED_EJECTED, h->now);
		} else {
			COUNT(h->cnt, no_replica);
		}
		return HEDGE_DROPPED;
	}
	/* ... the budget pays for it (bucket: the token the splitter took) ... */
	if (!budget_charge(h->cfg, h->st, h->now)) {
		hedge_give_up(h, REQ_REFUSED);
		COUNT(h->cnt, budget_exhausted);
		hedge_event(HEDGE_EV_REFUSED, h->key, e, rep, HEDGE_REFUSED_BUDGET, h->now);
		return HEDGE_DROPPED;
	}
	/* ... and it is claimed before it is built and leaves: a response from now on finds
	 * HEDGED, and the later of the two is dropped as the duplicate. A response that came
	 * first keeps its claim: nothing is sent. */
	if (__sync_val_compare_and_swap(&e->state, h->s, REQ_HEDGED) != h->s) {
		budget_refund(h->cfg, h->st, h->now);
		count_answered(h);
		return HEDGE_DROPPED;
	}
	if (e->hedges_sent + 1 < max)
		hedge_again(skb, h);
	if (hedge_build_from(skb, h, rep) < 0) {
		hedge_unclaim(h);
		if (h->c)
			COUNT(h->cnt, hedge_build_errors);
		else
			COUNT(h->cnt, hedge_rewrite_errors);
		return HEDGE_DROPPED;
	}
	e->hedged_ns = h->now;
	e->hedge_replica = rep;
	e->hedges_sent++;
	e->tried = tried | (1U << rep);
	replica_sent(h->cfg, h->st, rep, h->now);
	skb->mark = cfg.hedge_mark;
	record_precision(h->svc, h->now, h->deadline);
	COUNT(h->cnt, hedges_sent);
	hedge_event(HEDGE_EV_SENT, h->key, e, rep, 0, h->now);
	if (h->c)
		COUNT(h->cnt, tick_hedges);
	return HEDGE_BUILT;
}

#endif /* KEDGE_HEDGE_SEND_H */
