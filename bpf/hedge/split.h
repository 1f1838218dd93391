/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* split.h - the splitter (hedge_split, TC egress of the client interface), the first stage:
 * every hedgeable request (hedgeable.h) to a hedged service is recorded; when the budget
 * allows, its hedge is prepared - stored for a pacer tick (store.h) when its payload fits the
 * service's store_limit (recorded in its ring cell: no scoreboard entry until it is due),
 * else recorded in the scoreboard and carried through the delay line with its deadline (a
 * clone, pacer_carry). The request itself always passes. */
#ifndef KEDGE_HEDGE_SPLIT_H
#define KEDGE_HEDGE_SPLIT_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "clock.h"
#include "counters.h"
#include "hedge.h"
#include "maps.h"
#include "budget.h"
#include "match.h"
#include "hedgeable.h"
#include "store.h"
#include "pacer_client.h"

/* split (client egress): record the request; store it for a hedge from a pacer tick (its
 * payload within the service's store_limit), or else clone it into the delay line, when the
 * budget allows (bucket: a free token). The request itself always passes. */
static __always_inline int split(struct __sk_buff *skb)
{
	struct match m;
	struct hreq r = {};
	__u64 now;
	int token;

	if (skb->mark == cfg.hedge_mark)
		return TC_ACT_UNSPEC; /* a hedge we sent: never cloned again */
	if (!match(skb, &m, MATCH_REQUEST))
		return TC_ACT_UNSPEC;
	COUNT(m.cnt, requests);
	if (!hedgeable(skb, &m.p, m.cfg)) {
		COUNT(m.cnt, not_hedgeable); /* not safe to send twice: not recorded, never hedged */
		return TC_ACT_UNSPEC;
	}
	now = kedge_now();
	budget_request(m.cfg, m.st, now);

	r.sent_ns = now;
	r.deadline_ns = now + m.cfg->delay_ns;
	r.state = REQ_PENDING;
	r.orig_replica = m.cfg->orig_index;
	r.hedge_replica = REPLICA_NONE;
	r.tried = r.orig_replica < REPLICA_MAX ? 1U << r.orig_replica : 0;
	/* Bucket: the clone takes its hedge's token now, so none rides the delay line only to be
	 * refused and concurrent requests cannot all count on the same token. Window: every
	 * request is cloned; its hedge is charged when due. */
	token = budget_reserve(m.cfg, m.st);
	if (!token) {
		COUNT(m.cnt, budget_exhausted);
		r.state = REQ_NOCLONE;
	} else if (m.cfg->store_limit) {
		/* Stored: the request lives in its ring cell, not in the scoreboard, until it is
		 * answered or due (store.h). */
		switch (store_request(skb, &m, &r)) {
		case STORE_OK:
			COUNT(m.cnt, stored);
			return TC_ACT_UNSPEC;
		case STORE_TOO_LARGE:
			COUNT(m.cnt, store_too_large);
			break;
		case STORE_FULL:
			COUNT(m.cnt, store_full);
			break;
		default:
			COUNT(m.cnt, store_unsupported);
		}
		if (cfg.no_carry) {
			/* No clone path: the pacer carries nothing (no conveyor fillers). */
			budget_release(m.cfg, m.st);
			token = 0;
			r.state = REQ_NOCLONE;
		}
	}
	if (bpf_map_update_elem(&scoreboard, &m.key, &r, BPF_ANY) < 0) {
		if (token)
			budget_release(m.cfg, m.st);
		COUNT(m.cnt, scoreboard_errors);
		return TC_ACT_UNSPEC;
	}
	if (!token)
		return TC_ACT_UNSPEC;
	if (pacer_carry(skb, r.deadline_ns) < 0) {
		struct hreq *e = bpf_map_lookup_elem(&scoreboard, &m.key);

		budget_release(m.cfg, m.st);
		COUNT(m.cnt, clone_errors);
		if (e)
			e->state = REQ_NOCLONE;
		return TC_ACT_UNSPEC;
	}
	COUNT(m.cnt, clones);
	return TC_ACT_UNSPEC;
}

#endif /* KEDGE_HEDGE_SPLIT_H */
