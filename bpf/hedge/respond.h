/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* respond.h - the response path (hedge_resp, TC ingress of the client interface), the last
 * stage: the first response completes its request (its latency recorded, the replicas'
 * estimates updated) and is rewritten to the address the client used; the later ones of a
 * hedged request are dropped, and the entry goes once every copy was answered. */
#ifndef KEDGE_HEDGE_RESPOND_H
#define KEDGE_HEDGE_RESPOND_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "clock.h"
#include "counters.h"
#include "hedge.h"
#include "maps.h"
#include "replica.h"
#include "timer.h"
#include "match.h"
#include "rewrite.h"
#include "store.h"
#include "events.h"

/* claim_response moves a request's state on for a response with compare-and-exchange, so
 * that two responses on two CPUs cannot both pass as the first. Returns the state it moved
 * from (the response's role), or 0 when it kept losing races (the response passes). */
static __always_inline __u32 claim_response(struct hreq *e)
{
	__u32 s, next;

	for (int i = 0; i < 4; i++) {
		s = READ_ONCE(e->state);
		switch (s) {
		case REQ_PENDING:
			next = REQ_ANSWERED;
			break;
		case REQ_HEDGED:
			next = REQ_ANSWERED_HEDGED;
			break;
		case REQ_ANSWERED:
		case REQ_ANSWERED_HEDGED:
			return s; /* not first: nothing to claim */
		default: /* NOCLONE / NOHEDGE / REFUSED: completed by this response */
			next = REQ_ANSWERED;
		}
		if (__sync_val_compare_and_swap(&e->state, s, next) == s)
			return s;
	}
	return 0;
}

/* hedge_won: the response came from a replica a hedge went to. With a single address the
 * responses cannot be told apart; a response after the hedge left counts as the hedge's. */
static __always_inline int hedge_won(const struct hreq *e, const struct replica_ref *ref)
{
	return ref->index == e->hedge_replica ||
	       (ref->index < REPLICA_MAX && ref->index != e->orig_replica && (e->tried >> ref->index) & 1);
}

/* replied_to: when the copy that replica idx answers was sent (the hedge's time for the
 * hedge's replica, else the request's). */
static __always_inline __u64 replied_to(struct hreq *e, __u32 idx)
{
	return idx == e->hedge_replica && idx != e->orig_replica ? e->hedged_ns : e->sent_ns;
}

/* respond_rewrite: a first response from another replica than the one the client addressed
 * is rewritten so the client (a connected socket included) accepts it. */
static __always_inline int respond_rewrite(struct __sk_buff *skb, struct match *m)
{
	__u32 orig = m->cfg->orig_index;

	if (m->ref.is_svc || orig >= REPLICA_MAX || m->ref.index >= REPLICA_MAX)
		return TC_ACT_UNSPEC;
	{
		struct svc_addr from = *replica_at(m->cfg, m->ref.index);
		struct svc_addr to = *replica_at(m->cfg, orig);

		if (rewrite_addr(skb, &m->p, 0, &from, &to) < 0) {
			COUNT(m->cnt, response_rewrite_errors);
			return TC_ACT_UNSPEC;
		}
		COUNT(m->cnt, responses_rewritten);
	}
	return TC_ACT_UNSPEC;
}

/* respond (client ingress): the first response completes the request (and is rewritten to
 * the address the client used); the later ones of a hedged request are dropped, and the
 * entry goes once every copy (the request and its hedges) was answered. */
static __always_inline int respond(struct __sk_buff *skb)
{
	struct match m;
	struct hreq *e;
	__u64 now, sent = 0;
	__u32 s;

	if (!match(skb, &m, MATCH_RESPONSE))
		return TC_ACT_UNSPEC;
	/* A stored request still pending lives in its ring cell only (store.h). */
	switch (store_claim(&m, &sent)) {
	case CELL_ANSWERED:
		return TC_ACT_UNSPEC; /* as REQ_ANSWERED below */
	case CELL_CLAIMED:
		now = kedge_now();
		record_latency(m.svc, m.st, now - sent);
		replica_observe(m.svc, m.cfg, m.st, m.ref.index, now - sent);
		COUNT(m.cnt, responses);
		store_pop_answered(&m);
		return respond_rewrite(skb, &m);
	}
	e = bpf_map_lookup_elem(&scoreboard, &m.key);
	if (!e) {
		/* Not tracked: not hedgeable, expired, evicted, answered and gone, or an id spec
		 * that does not fit the service (user space warns when that is all it sees). */
		COUNT(m.cnt, unmatched_responses);
		return TC_ACT_UNSPEC;
	}

	now = kedge_now();
	s = claim_response(e);
	switch (s) {
	case 0:
		return TC_ACT_UNSPEC;
	case REQ_ANSWERED_HEDGED:
		/* The loser's latency: what shows a replica slow (replica.h). */
		replica_observe(m.svc, m.cfg, m.st, m.ref.index, now - replied_to(e, m.ref.index));
		if (__sync_fetch_and_add(&e->late_responses, 1) + 1 >= e->hedges_sent)
			bpf_map_delete_elem(&scoreboard, &m.key);
		COUNT(m.cnt, duplicates_dropped);
		return TC_ACT_SHOT;
	case REQ_ANSWERED:
		return TC_ACT_UNSPEC; /* the application's own duplicate: not ours to judge */
	}

	record_latency(m.svc, m.st, now - e->sent_ns);
	replica_observe(m.svc, m.cfg, m.st, m.ref.index, now - replied_to(e, m.ref.index));
	if (s == REQ_HEDGED) {
		/* The other copies are still out: a lower bound of their replicas' latency (every
		 * hedge's counted from the last hedge's time: errs low, harmless). */
		for (__u32 i = 0; i < REPLICA_MAX; i++) {
			if (i != m.ref.index && (e->tried >> i) & 1)
				replica_overdue(m.cfg, m.st, i, now - (i == e->orig_replica ? e->sent_ns : e->hedged_ns));
		}
	}
	COUNT(m.cnt, responses);
	if (s == REQ_HEDGED) {
		int won = hedge_won(e, &m.ref);

		if (won)
			COUNT(m.cnt, hedges_won);
		hedge_event(won ? HEDGE_EV_WON : HEDGE_EV_LOST, &m.key, e, m.ref.index, 0, now);
	} else if (s != REQ_PENDING) {
		/* NOCLONE / NOHEDGE / REFUSED: nothing follows. A NOCLONE or REFUSED request
		 * answered after its deadline is one the budget kept from being hedged (user space
		 * warns when they pile up). A PENDING one stays ANSWERED until its clone comes
		 * out or its stored cell is popped at a tick. */
		if ((s == REQ_NOCLONE || s == REQ_REFUSED) && now > e->deadline_ns)
			COUNT(m.cnt, unhedged_late);
		bpf_map_delete_elem(&scoreboard, &m.key);
		return TC_ACT_UNSPEC;
	}

	return respond_rewrite(skb, &m);
}

#endif /* KEDGE_HEDGE_RESPOND_H */
