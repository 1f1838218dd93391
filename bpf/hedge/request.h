/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* request.h - the request path: match a datagram to a service and request, the budget,
 * the address rewrites, and the three packet handlers (split, rescue, respond) that
 * hedge.bpf.c attaches. Each reads as parse -> decide -> act -> count. */
#ifndef KEDGE_HEDGE_REQUEST_H
#define KEDGE_HEDGE_REQUEST_H

#include "maps.h"
#include "timer.h"
#include "budget.h"

/* Which side of an exchange a datagram is: a request goes to a service address (client ->
 * service), a response comes from a service or replica address (service -> client). */
enum match_dir {
	MATCH_REQUEST = 0,
	MATCH_RESPONSE = 1,
};

/* A parsed UDP datagram matched to a service and request. */
struct match {
	struct pkt p;
	struct hreq_key key;
	struct replica_ref ref; /* responses: the replica (or service address) it came from */
	__u32 svc;
	struct svc_cfg *cfg;
	struct svc_state *st;
	struct hedge_stats *cnt;
};

static __always_inline void addr_key(struct svc_key *k, const struct in6_addr *a, __be16 port)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->a.addr = *a;
	k->a.port = port;
}

/* is_malformed: parse.h rejected the packet, and not for being something else than IP or a
 * fragment (those are not malformed). Nothing is known of its ports, so no service. */
static __always_inline int is_malformed(int perr, const struct pkt *p)
{
	return perr != PARSE_OK && perr != PARSE_ERR_L3_PROTO && perr != PARSE_ERR_FRAGMENT &&
	       !(p->flags & PKT_F_FRAG);
}

/* count_unparsed counts what match() passes for not being an unfragmented UDP datagram:
 * malformed packets in the global slot (malformed / malformed_responses), and outgoing
 * fragments (to a service's address, or non-first ones, which have no ports). */
static __always_inline void count_unparsed(int dir, int perr, const struct pkt *p)
{
	struct svc_key k;

	if (dir == MATCH_RESPONSE) {
		if (is_malformed(perr, p))
			COUNT(stats_global(), malformed_responses);
		return;
	}
	if (perr == PARSE_ERR_FRAGMENT || p->flags & PKT_F_FRAG) {
		addr_key(&k, &p->daddr, p->dport);
		if (perr == PARSE_ERR_FRAGMENT || bpf_map_lookup_elem(&services, &k))
			COUNT(stats_global(), fragments);
	} else if (is_malformed(perr, p)) {
		COUNT(stats_global(), malformed);
	}
}

/* match: the datagram is a request to a service address (dir MATCH_REQUEST) or a response
 * from a service or replica address (MATCH_RESPONSE) of an enabled service, with its
 * request id; fills m and the scoreboard key (client address and port, service, id).
 * Returns 1 on a match; what does not match passes untouched, counted as above, or as
 * short_requests / short_responses when the datagram is shorter than its request id. */
static __always_inline int match(struct __sk_buff *skb, struct match *m, int dir)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	const struct in6_addr *svc_addr, *cli_addr;
	__be16 svc_port, cli_port;
	struct svc_key k;
	int perr;

	perr = parse_pkt(data, data_end, &m->p);
	if (perr != PARSE_OK || m->p.l4_proto != IPPROTO_UDP || (m->p.flags & PKT_F_FRAG)) {
		count_unparsed(dir, perr, &m->p);
		return 0;
	}
	if (dir == MATCH_REQUEST) {
		svc_addr = &m->p.daddr, svc_port = m->p.dport;
		cli_addr = &m->p.saddr, cli_port = m->p.sport;
	} else {
		svc_addr = &m->p.saddr, svc_port = m->p.sport;
		cli_addr = &m->p.daddr, cli_port = m->p.dport;
	}
	addr_key(&k, svc_addr, svc_port);
	if (dir == MATCH_REQUEST) {
		__u32 *svc = bpf_map_lookup_elem(&services, &k);

		if (!svc)
			return 0;
		m->svc = *svc;
		m->ref.index = REPLICA_NONE;
	} else {
		struct replica_ref *r = bpf_map_lookup_elem(&replicas, &k);

		if (!r)
			return 0;
		m->ref = *r;
		m->svc = r->svc;
	}
	if (m->svc >= SVC_MAX)
		return 0;
	m->cfg = bpf_map_lookup_elem(&svc_cfgs, &m->svc);
	m->st = bpf_map_lookup_elem(&svc_states, &m->svc);
	m->cnt = stats_for(m->svc);
	if (!m->cfg || !m->st || !m->cfg->enabled)
		return 0;
	__builtin_memset(&m->key, 0, sizeof(m->key));
	if (reqid_load(skb, &m->p, &m->cfg->reqid, &m->key.id) < 0) {
		if (dir == MATCH_REQUEST)
			COUNT(m->cnt, short_requests);
		else
			COUNT(m->cnt, short_responses);
		return 0;
	}
	m->key.caddr = *cli_addr;
	m->key.cport = cli_port;
	m->key.svc = m->svc;
	return 1;
}

/* rewrite_addr replaces the 16-byte (IPv6) or 4-byte (IPv4) destination (is_dst) or source
 * address and port, keeping IP and UDP checksums right whatever the skb's checksum state
 * (the helpers handle CHECKSUM_PARTIAL/COMPLETE/NONE).
 * Every UDP checksum update carries BPF_F_MARK_MANGLED_0, IPv6 included: an incremental
 * update whose result computes to 0 must be written as 0xffff (RFC 768; RFC 8200 8.1),
 * since 0 means "no checksum" - which IPv6 receivers drop. */
static __always_inline int rewrite_addr(struct __sk_buff *skb, const struct pkt *p, int is_dst,
					const struct svc_addr *from_a, const struct svc_addr *to_a)
{
	__u32 l4csum = p->l4_off + offsetof(struct udphdr, check);
	__u32 poff = p->l4_off + (is_dst ? offsetof(struct udphdr, dest) : offsetof(struct udphdr, source));
	__be16 from_port = from_a->port, to_port = to_a->port;
	__be32 diff;

	if (p->l3_proto == ETH_P_IP) {
		__u32 aoff = p->l3_off + (is_dst ? offsetof(struct iphdr, daddr) : offsetof(struct iphdr, saddr));
		__be32 from = from_a->addr.in6_u.u6_addr32[3], to = to_a->addr.in6_u.u6_addr32[3];

		if (from != to) {
			if (bpf_l4_csum_replace(skb, l4csum, from, to, L4_CSUM_ADDR_FLAGS(1) | sizeof(to)) < 0 ||
			    bpf_l3_csum_replace(skb, p->l3_off + offsetof(struct iphdr, check), from, to, sizeof(to)) < 0 ||
			    bpf_skb_store_bytes(skb, aoff, &to, sizeof(to), 0) < 0)
				return -1;
		}
	} else {
		__u32 aoff = p->l3_off + (is_dst ? offsetof(struct ipv6hdr, daddr) : offsetof(struct ipv6hdr, saddr));
		struct in6_addr from = from_a->addr, to = to_a->addr;

		diff = bpf_csum_diff((__be32 *)&from, sizeof(from), (__be32 *)&to, sizeof(to), 0);
		if (bpf_l4_csum_replace(skb, l4csum, 0, diff, L4_CSUM_ADDR_FLAGS(1)) < 0 ||
		    bpf_skb_store_bytes(skb, aoff, &to, sizeof(to), 0) < 0)
			return -1;
	}
	if (from_port != to_port) {
		if (bpf_l4_csum_replace(skb, l4csum, from_port, to_port,
					BPF_F_MARK_MANGLED_0 | sizeof(to_port)) < 0 ||
		    bpf_skb_store_bytes(skb, poff, &to_port, sizeof(to_port), 0) < 0)
			return -1;
	}
	return 0;
}

/* replica_at bounds the index for the verifier (clang drops range checks it can prove, and
 * the verifier cannot follow % or the check on a different register). */
static __always_inline struct svc_addr *replica_at(struct svc_cfg *sc, __u32 i)
{
	barrier_var(i);
	i &= REPLICA_MAX - 1;
	return &sc->replicas[i];
}

/* The stored path needs match, pick_replica and replica_at from above. */
#include "store.h"

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
	now = bpf_ktime_get_ns();
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
	}
	if (bpf_map_update_elem(&scoreboard, &m.key, &r, BPF_ANY) < 0) {
		if (token)
			budget_release(m.cfg, m.st);
		COUNT(m.cnt, scoreboard_errors);
		return TC_ACT_UNSPEC;
	}
	if (!token)
		return TC_ACT_UNSPEC;
	if (m.cfg->store_limit) {
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
			struct hreq *e = bpf_map_lookup_elem(&scoreboard, &m.key);

			budget_release(m.cfg, m.st);
			if (e)
				__sync_val_compare_and_swap(&e->state, REQ_PENDING, REQ_NOCLONE);
			return TC_ACT_UNSPEC;
		}
	}
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

/* hedge_failed: the clone was due but no hedge left (the packet is dropped). The entry
 * becomes NOHEDGE, so its response completes it, and the clone's reservation goes back. */
static __always_inline void hedge_failed(struct match *m, struct hreq *e)
{
	__sync_val_compare_and_swap(&e->state, REQ_PENDING, REQ_NOHEDGE);
	budget_release(m->cfg, m->st);
}

/* clone_unsent: the hedge was claimed (state s -> HEDGED) and charged but could not be
 * sent: a first hedge's entry becomes NOHEDGE, so its response completes it (a further
 * hedge's stays HEDGED: the earlier hedges are out), and the charge is refunded (bucket:
 * the token goes back; window: the slot's hedge). */
static __always_inline void clone_unsent(struct match *m, struct hreq *e, __u32 s, __u64 now)
{
	if (s == REQ_PENDING)
		__sync_val_compare_and_swap(&e->state, REQ_HEDGED, REQ_NOHEDGE);
	budget_refund(m->cfg, m->st, now);
}

/* clone_delay: the delay the clone's entry waits: from the request's send time for the
 * first hedge, from the last hedge's for a further one (max_hedges). */
static __always_inline __u64 clone_delay(const struct hreq *e)
{
	__u64 from = e->hedges_sent ? e->hedged_ns : e->sent_ns;

	return e->deadline_ns > from ? e->deadline_ns - from : 0;
}

/* carry_again: the request may have a further hedge (max_hedges), so the clone, not yet
 * rewritten, goes round the delay line again, due at now + delay, on a budget reservation
 * of its own (bucket: a token; returned when it comes out with nothing to do). */
static __always_inline void carry_again(struct __sk_buff *skb, struct match *m, struct hreq *e, __u64 now,
					__u64 delay)
{
	if (!budget_reserve(m->cfg, m->st)) {
		COUNT(m->cnt, budget_exhausted);
		return;
	}
	e->deadline_ns = now + delay; /* before the clone can be back */
	if (pacer_carry(skb, now + delay) < 0) {
		budget_release(m->cfg, m->st);
		COUNT(m->cnt, requeue_full);
		return;
	}
	COUNT(m->cnt, requeued);
}

/* rescue_clone (the pacer's tick program, a carried clone back from the delay line): drop
 * it when its request was answered (or has had its hedges), send it round again when not
 * due yet, drop it when far overdue (as the stored path does: store.h, far_overdue), else
 * rewrite it to a replica that has no copy yet and send it as the hedge; with max_hedges
 * left, a clone of it goes round again for the next one. Not inlined: its stack frame stays
 * off the tick path's call chain (store.h), which the verifier adds up. */
static __noinline int rescue_clone(struct __sk_buff *skb)
{
	struct match m;
	struct hreq *e;
	struct svc_addr to, from;
	__u32 idx, s, max, tried;
	__u64 now, deadline, delay;
	long ret;

	if (!match(skb, &m, MATCH_REQUEST)) {
		/* Nothing but clones of hedged requests arrive here; anything else is dropped. */
		COUNT(stats_global(), rescue_unmatched);
		return TC_ACT_SHOT;
	}
	e = bpf_map_lookup_elem(&scoreboard, &m.key);
	if (!e) {
		budget_release(m.cfg, m.st);
		COUNT(m.cnt, clones_orphaned);
		return TC_ACT_SHOT;
	}
	s = READ_ONCE(e->state);
	max = m.cfg->max_hedges ? m.cfg->max_hedges : 1;
	/* HEDGED with hedges left: the clone carried again for the next (HEDGED and none sent yet:
	 * a claim in flight on another CPU, this is a stale clone). */
	if (s != REQ_PENDING && !(s == REQ_HEDGED && e->hedges_sent && e->hedges_sent < max)) {
		if (s == REQ_ANSWERED)
			bpf_map_delete_elem(&scoreboard, &m.key);
		budget_release(m.cfg, m.st);
		COUNT(m.cnt, clones_answered);
		return TC_ACT_SHOT;
	}
	now = bpf_ktime_get_ns();
	deadline = e->deadline_ns;
	if (!pacer_due(deadline, now, 1)) {
		ret = pacer_recirculate(skb, deadline);
		if (ret != TC_ACT_REDIRECT) {
			hedge_failed(&m, e);
			COUNT(m.cnt, redirect_errors);
			return TC_ACT_SHOT;
		}
		COUNT(m.cnt, recirculations);
		return ret;
	}
	/* So late, the delay line was behind: the client may have given up (store.h). */
	delay = clone_delay(e);
	if (far_overdue(deadline, delay, now)) {
		hedge_failed(&m, e);
		COUNT(m.cnt, overdue_dropped);
		return TC_ACT_SHOT;
	}
	/* Due and unanswered: a replica that does not have it yet (replica.h) ... */
	tried = tried_of(e);
	idx = pick_replica(m.cfg, m.st, tried);
	if (idx >= REPLICA_MAX) {
		hedge_failed(&m, e);
		COUNT(m.cnt, no_replica);
		return TC_ACT_SHOT;
	}
	/* ... and the budget pays for the hedge (bucket: the clone's token). */
	if (!budget_charge(m.cfg, m.st, now)) {
		__sync_val_compare_and_swap(&e->state, REQ_PENDING, REQ_REFUSED);
		COUNT(m.cnt, budget_exhausted);
		return TC_ACT_SHOT;
	}
	/* Claimed before it leaves (see store_hedge in store.h): a response that came first
	 * keeps its claim and the clone is dropped. */
	if (__sync_val_compare_and_swap(&e->state, s, REQ_HEDGED) != s) {
		budget_refund(m.cfg, m.st, now);
		COUNT(m.cnt, clones_answered);
		return TC_ACT_SHOT;
	}
	if (e->hedges_sent + 1 < max)
		carry_again(skb, &m, e, now, delay);
	to = *replica_at(m.cfg, idx);
	__builtin_memset(&from, 0, sizeof(from));
	from.addr = m.p.daddr;
	from.port = m.p.dport;
	if (rewrite_addr(skb, &m.p, 1, &from, &to) < 0) {
		clone_unsent(&m, e, s, now);
		COUNT(m.cnt, hedge_rewrite_errors);
		return TC_ACT_SHOT;
	}
	skb->mark = cfg.hedge_mark;
	ret = bpf_redirect_neigh(cfg.out_ifindex, NULL, 0, 0);
	if (ret != TC_ACT_REDIRECT) {
		clone_unsent(&m, e, s, now);
		COUNT(m.cnt, redirect_errors);
		return TC_ACT_SHOT;
	}
	e->hedged_ns = now;
	e->hedge_replica = idx;
	e->hedges_sent++;
	e->tried = tried | (1U << idx);
	record_precision(m.svc, now, deadline);
	COUNT(m.cnt, hedges_sent);
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

/* respond (client ingress): the first response completes the request (and is rewritten to
 * the address the client used); the later ones of a hedged request are dropped, and the
 * entry goes once every copy (the request and its hedges) was answered. */
static __always_inline int respond(struct __sk_buff *skb)
{
	struct match m;
	struct hreq *e;
	__u64 now;
	__u32 orig, s;

	if (!match(skb, &m, MATCH_RESPONSE))
		return TC_ACT_UNSPEC;
	e = bpf_map_lookup_elem(&scoreboard, &m.key);
	if (!e)
		return TC_ACT_UNSPEC; /* not tracked (expired, evicted, or not a hedged service's request) */

	now = bpf_ktime_get_ns();
	s = claim_response(e);
	switch (s) {
	case 0:
		return TC_ACT_UNSPEC;
	case REQ_ANSWERED_HEDGED:
		/* The loser's latency: what shows a replica slow (replica.h). */
		replica_observe(m.cfg, m.st, m.ref.index, now - replied_to(e, m.ref.index));
		if (__sync_fetch_and_add(&e->late_responses, 1) + 1 >= e->hedges_sent)
			bpf_map_delete_elem(&scoreboard, &m.key);
		COUNT(m.cnt, duplicates_dropped);
		return TC_ACT_SHOT;
	case REQ_ANSWERED:
		return TC_ACT_UNSPEC; /* the application's own duplicate: not ours to judge */
	}

	record_latency(m.svc, m.st, now - e->sent_ns);
	replica_observe(m.cfg, m.st, m.ref.index, now - replied_to(e, m.ref.index));
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
		if (hedge_won(e, &m.ref))
			COUNT(m.cnt, hedges_won);
	} else if (s != REQ_PENDING) {
		/* NOCLONE / NOHEDGE / REFUSED: nothing follows. A NOCLONE or REFUSED request
		 * answered after its deadline is one the budget kept from being hedged (user space
		 * warns when they pile up). A PENDING one stays ANSWERED until its clone comes
		 * out or its stored cell is popped (below, or at a tick). */
		if ((s == REQ_NOCLONE || s == REQ_REFUSED) && now > e->deadline_ns)
			COUNT(m.cnt, unhedged_late);
		bpf_map_delete_elem(&scoreboard, &m.key);
		return TC_ACT_UNSPEC;
	}

	/* A stored request's cell leaves the ring now when it is the head (no tick needed). */
	if (s == REQ_PENDING)
		store_answered(&m, e);

	/* A response from another replica than the one the client addressed is rewritten so
	 * the client (a connected socket included) accepts it. */
	orig = m.cfg->orig_index;
	if (m.ref.is_svc || orig >= REPLICA_MAX || m.ref.index >= REPLICA_MAX)
		return TC_ACT_UNSPEC;
	{
		struct svc_addr from = *replica_at(m.cfg, m.ref.index);
		struct svc_addr to = *replica_at(m.cfg, orig);

		if (rewrite_addr(skb, &m.p, 0, &from, &to) < 0) {
			COUNT(m.cnt, response_rewrite_errors);
			return TC_ACT_UNSPEC;
		}
		COUNT(m.cnt, responses_rewritten);
	}
	return TC_ACT_UNSPEC;
}

#endif /* KEDGE_HEDGE_REQUEST_H */
