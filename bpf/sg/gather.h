/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* gather.h - XDP ingress: replies are checked, reduced into their slot and consumed.
 *
 * A reply counts only when all of these hold, in this order (the first that fails decides
 * the counter and the verdict):
 *   sg magic + version + op REPLY ........ else passed (malformed / bad_version counted)
 *   configured group ...................... else passed (unknown_group)
 *   to the group's coordinator socket, from the registered address and port of the worker
 *   index it names (SG_GF_REPLICAS: of one of its shard's replicas, which
 *   clears that replica's judgement: replica.h)
 *                                           else passed (unregistered): it may be someone
 *                                           else's traffic, and it is never aggregated
 *   single packet ......................... else the part path (parts.h)
 *   status 0, payload length right for the reduction
 *                                           else passed (bad_length) or dropped
 *                                           (worker_errors)
 *   slot holds this full request id ....... else dropped (stale: a recycled slot)
 *   slot still pending .................... else dropped (late)
 *   worker's bit not yet set .............. else dropped (duplicates; late_replies for a
 *                                           worker a re-send went to: stored.h)
 * Then it is reduced under the slot's lock and dropped (SG_RED_USER: the group's user
 * reduction is tail-called to do that, sg_user.h); the reply that completes the
 * request (count reaches need) also emits the result into the ring buffer, and with the
 * group flag SG_GF_WAKE_SOCKET it is passed (XDP_PASS, untouched) to the coordinator
 * socket instead of dropped: its arrival wakes the reader (docs/sg.md, Delivery). */
#ifndef KEDGE_SG_GATHER_H
#define KEDGE_SG_GATHER_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "counters.h"
#include "parse.h"
#include "sg.h"
#include "maps.h"
#include "reply.h"
#include "parts.h"
#include "replica.h"
#include "stored.h"

#define OP_FIRST 0xff

/* reduce_reply folds the payload at v (checked against data_end) into s.
 * Runs under s->lock: no helper calls. */
static __always_inline void reduce_reply(struct sg_slot *s, const struct sg_group *g,
					 void *v, void *data_end, __u32 worker)
{
	__u32 op = g->reduce;
	__u32 n = g->elems;

	if (op == SG_RED_COUNT)
		return;
	if (op == SG_RED_GATHER) {
		__u32 words = n * (g->dtype == SG_T_I64 ? 2 : 1);
		__u32 at = s->res.gathered * words;
		__u32 *dst = (__u32 *)s->res.agg;
		__be32 *src = v;

		if (s->res.gathered >= g->gather_k || s->res.gathered >= SG_GATHER_MAX)
			return;
		for (__u32 i = 0; i < SG_AGG_WORDS; i++) {
			if (i >= words || (void *)(src + i + 1) > data_end)
				break;
			/* The mask keeps the index in bounds for the verifier; user space
			 * guarantees gather_k * words <= SG_AGG_WORDS. */
			dst[(at + i) & (SG_AGG_WORDS - 1)] = src[i]; /* raw bytes, as sent */
		}
		s->res.order[s->res.gathered & (SG_GATHER_MAX - 1)] = worker;
		s->res.gathered++;
		return;
	}
	/* The first reply of a MIN/MAX request sets the accumulators, unless parts of
	 * multi-packet replies came first: they started them at the identity (parts.h). */
	if (op != SG_RED_SUM && s->res.count == 0 && !(s->res.flags & SG_F_PARTS))
		op = OP_FIRST;
	if (g->dtype == SG_T_I64)
		reduce_i64(s, op, 0, n, v, data_end);
	else
		reduce_i32(s, op, 0, n, v, data_end);
}

/* A reply of a group with SG_RED_USER: gather() has written what the user reduction needs
 * into sg_user_call and returns this; sg_gather then tail-calls the group's program. */
#define GATHER_USER 0x100

/* user_handoff writes what a user reduction needs (struct sg_user_call). */
static __always_inline int user_handoff(struct sg_stats *cnt, __u32 gid, __u32 widx, __u32 off,
					__u32 len)
{
	__u32 zero = 0;
	struct sg_user_call *c = bpf_map_lookup_elem(&sg_user_call, &zero);

	if (!c) {
		COUNT(cnt, user_errors);
		return XDP_DROP;
	}
	c->group = gid;
	c->worker = widx;
	c->off = off;
	c->len = len;
	c->armed = 1;
	return GATHER_USER;
}

/* call_user tail-calls the user reduction of the reply's group (sg_user_progs), which
 * reduces it (sg_user.h); returns only when the group has none. */
static __always_inline int call_user(struct xdp_md *ctx)
{
	__u32 zero = 0;
	struct sg_user_call *c = bpf_map_lookup_elem(&sg_user_call, &zero);
	__u32 gid;

	if (!c)
		return XDP_DROP;
	gid = c->group;
	bpf_tail_call(ctx, &sg_user_progs, gid);
	c->armed = 0;
	COUNT(stats_for(gid < SG_GROUPS_MAX ? gid : NO_GROUP), user_errors);
	return XDP_DROP;
}

static __always_inline int gather(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct sg_stats *gcnt = stats_for(NO_GROUP), *cnt;
	struct sg_worker *w;
	struct sg_group *g;
	struct sg_slot *s;
	struct sg_parts *e = NULL;
	struct sg_shard *sh = NULL;
	struct sg_hdr *h;
	struct pkt p;
	__u32 gid, widx, key, slot, plen, want, word, rep = 0, who;
	__u64 id, now, mask, start = 0;
	int perr, outcome;
	__u16 flags_before;

	perr = parse_pkt(data, data_end, &p);
	if (perr != PARSE_OK || p.l4_proto != IPPROTO_UDP || (p.flags & PKT_F_FRAG))
		return XDP_PASS;
	h = pkt_hdr(data, data_end, p.payload_off, sizeof(__be16));
	if (!h || h->magic != bpf_htons(SG_MAGIC))
		return XDP_PASS;
	h = pkt_hdr(data, data_end, p.payload_off, sizeof(*h));
	if (!h || p.payload_len < sizeof(*h)) {
		COUNT(gcnt, malformed);
		return XDP_PASS;
	}
	if (h->version != SG_VERSION) {
		COUNT(gcnt, bad_version);
		return XDP_PASS;
	}
	if (h->op != SG_OP_REPLY)
		return XDP_PASS; /* a request arriving: this host is a worker too */
	plen = bpf_ntohl(h->payload_len);
	if (plen > p.payload_len - sizeof(*h)) {
		COUNT(gcnt, malformed);
		return XDP_PASS;
	}
	gid = bpf_ntohs(h->group);
	g = gid < SG_GROUPS_MAX ? bpf_map_lookup_elem(&groups, &gid) : NULL;
	if (!g || !g->enabled) {
		COUNT(gcnt, unknown_group);
		return XDP_PASS;
	}
	cnt = stats_for(gid);
	widx = bpf_ntohs(h->worker);
	if (p.dport != g->coord_port || !in6_addr_eq(&p.daddr, &g->coord_addr) ||
	    widx >= g->nworkers || widx >= SG_WORKERS_MAX) {
		COUNT(cnt, unregistered);
		return XDP_PASS;
	}
	if (g->flags & SG_GF_REPLICAS) {
		key = g->replica_base + widx;
		sh = bpf_map_lookup_elem(&replicas, &key);
		rep = sh ? shard_answered(sh, &p.saddr, p.sport) : 0;
		if (!rep) {
			COUNT(cnt, unregistered);
			return XDP_PASS;
		}
		if (g->replica_choice != SG_RC_LATENCY)
			sh = NULL; /* nothing to observe */
	} else {
		key = g->worker_base + widx;
		w = bpf_map_lookup_elem(&workers, &key);
		if (!w || w->port != p.sport || !in6_addr_eq(&w->addr, &p.saddr)) {
			COUNT(cnt, unregistered);
			return XDP_PASS;
		}
	}
	/* What stored_reply is told of the reply's source, packed here so that rep dies before
	 * the reductions: kept live to the end (with the precision its uses above give it), it
	 * split every verifier state of the reductions by replica: 6.1 walked 640,124
	 * instructions of this program instead of 525,206. The barrier keeps clang from
	 * moving the packing down to its use. */
	who = widx | rep << 16;
	barrier_var(who);
	if (bpf_ntohs(h->nparts) > 1)
		return gather_part(h, data_end, g, cnt, gid, widx, plen);
	want = g->reduce == SG_RED_COUNT ? plen : (__u32)g->elems * (g->dtype == SG_T_I64 ? 8 : 4);
	if (plen != want) {
		COUNT(cnt, bad_length);
		return XDP_PASS;
	}
	if (g->reduce != SG_RED_COUNT) {
		__u64 len = want;

		/* A 64-bit bound the verifier keeps (6.1 does not carry a 32-bit compare of
		 * a byte-swapped value over to the pointer arithmetic below). */
		barrier_var(len);
		if (len > SG_AGG_BYTES) {
			COUNT(cnt, bad_length);
			return XDP_PASS;
		}
		if ((void *)(h + 1) + len > data_end) {
			COUNT(gcnt, malformed); /* truncated: the IP/UDP lengths claim more */
			return XDP_PASS;
		}
	}
	if (g->reduce == SG_RED_USER)
		return user_handoff(cnt, gid, widx, p.payload_off, want);
	s = reply_slot(h, g, cnt, &id, &slot);
	if (!s)
		return XDP_DROP;
	/* Groups that take multi-packet replies: a worker must not mix parts and a whole
	 * reply in one request (its parts' slices would count twice). */
	if (g->flags & SG_GF_PARTS)
		e = parts_entry(g, slot, widx);
	mask = worker_bit(widx, &word);
	now = bpf_ktime_get_ns();

	/* SG_RC_LATENCY: this replica's reply time, late or duplicate replies too (the slower
	 * replica's time is what shows it slow). Read before the lock, unlocked: a racing
	 * reuse of the slot costs one sample, and nothing the reduction below depends on
	 * stays live across it (the verifier's states there stay as many as without it). */
	if (sh) {
		start = READ_ONCE(s->res.start_ns);
		if (READ_ONCE(s->res.req_id) == id && start && kedge_now() > start)
			shard_observe(sh, rep - 1, kedge_now() - start);
	}

	bpf_spin_lock(&s->lock);
	if (s->res.req_id != id || s->res.group != gid) {
		outcome = G_STALE;
	} else if (s->state != SG_SLOT_PENDING) {
		outcome = G_LATE;
	} else if (s->res.bitmap[word] & mask) {
		outcome = G_DUP;
	} else if (e && e->req_id == id && e->bits) {
		outcome = G_PART_MISMATCH;
	} else {
		flags_before = s->res.flags;
		reduce_reply(s, g, h + 1, data_end, widx);
		outcome = answered(s, word, mask, now) | overflowed(s, flags_before);
	}
	bpf_spin_unlock(&s->lock);
	if ((g->flags & SG_GF_RESEND) && stored_reply(slot, id, who, gid, outcome & 0xff))
		return XDP_DROP; /* a re-sent worker's second reply: late_replies */
	return gather_finish(outcome, s, g, cnt);
}

#endif /* KEDGE_SG_GATHER_H */
