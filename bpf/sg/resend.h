/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* resend.h - re-sends (groups with SG_GF_RESEND): sg_resend is the pacer's tick program
 * (docs/pacer.md; TC ingress of the pacer's veth in the coordinator's namespace).
 *
 *   the scatter       stores the request (stored.h) and asks for a tick at its first
 *                     round's due time, resend_ns after it was scattered
 *   a tick            resend_scan: every slot's stored request (resend_slot):
 *                       spent (completed, expired, or the slot reused) .. forgotten
 *                       not due ...................................... left for a later tick
 *                       due .......................................... the round is claimed
 *                         (compare-and-exchange of due_ns: one tick sends it), the next
 *                         round set (resend_max), the tick's skb rebuilt from the stored
 *                         frame, then for each worker that has not answered (resend_cb):
 *                           the budget pays for the copy ......... else resend_refused
 *                             (a repeat, or a retry past the round's first few, only
 *                             from above half its cap: budget_keep)
 *                           its target: groups with replicas, the next replica of the
 *                             shard after its last copy's that is not ejected (a hedge;
 *                             none: the same one, a retry); others, the same worker (a
 *                             retry)
 *                           addresses, port, worker index, MAC and checksums written,
 *                           bpf_clone_redirect out of the group's interface (a loopback
 *                           group's: round through the pacer veth, then
 *                           bpf_redirect_neigh, resend_send)
 *                           a worker's first re-send: a sample above the delay estimate
 *                             when the round began at or after it (stored.h, quantile_up)
 *                     then the next tick is asked for the earliest round still to come
 * The first reply of a worker counts, whichever copy it answers; a second is dropped and
 * counted late_replies (the gather's bitmap, stored.h). So a worker may see a request twice
 * (or more, resend_max): it must answer each copy as it would the first (its reply carries
 * the request id and worker index it echoes; nothing else is matched), and replicas of a
 * shard must give the same answer (an answer from either is the shard's).
 *
 * Checksums: the tick's skb does not carry the request's checksum state (it is the pacer's
 * frame), so every copy gets a full UDP checksum: the stored UDP header and payload's sum
 * (checksum field 0), with the port and worker index swapped for the copy's and the pseudo
 * header of its destination added; the IPv4 header's is updated for the address. */
#ifndef KEDGE_SG_RESEND_H
#define KEDGE_SG_RESEND_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "clock.h"
#include "counters.h"
#include "csum.h"
#include "parse.h"
#include "sg.h"
#include "maps.h"
#include "reply.h"
#include "replica.h"
#include "scatter.h"
#include "stored.h"
#include "pacer_client.h"

/* One round of one slot's re-sends: the rebuilt request and the round's counts, in a
 * per-CPU map value (the tick's call chain - program, scan, slot, worker - would exceed the
 * verifier's 512 bytes of stack with them on it; ticks run in softirq and do not nest on a
 * CPU). */
struct resend_state {
	struct scatter_ctx c; /* the rebuilt request, as parse_request read it */
	__u64 base;           /* the stored UDP header and payload's sum, without its port
			       * and worker index */
	__be32 saddr[4];      /* IPv4: [0] */
	__u32 udp_len;        /* host order */
	__u32 retries;
	__u32 hedges;
	__u32 refused;
	__u32 errors;
	__u32 again;
	__u32 censored;
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct resend_state);
} resend_state SEC(".maps");

/* What the per-worker loop works with: pointers stay on the stack. */
struct resend_ctx {
	struct __sk_buff *skb;
	struct sg_slot *s;
	struct sg_stored *st;
	struct sg_budget *b;
	const struct sg_group *g;
	struct resend_state *r;
	__u64 now;
	__u32 q_milli; /* the group's resend_quantile_milli */
	int censors;   /* a first re-send is a sample above the estimate (stored.h) */
};

/* stored_sum is the one's-complement sum of the stored frame from off (the UDP header) to
 * its end, zero-padded to whole words; negative on error. */
static __always_inline __s64 stored_sum(struct sg_stored *st, __u32 off, __u32 len)
{
	__u32 total, done, o, n;
	__s64 sum = 0;

	if (off >= len || len > SG_STORE_BYTES)
		return -1;
	total = (len - off + 3) & ~3U;
	for (__u32 i = 0; i < SG_STORE_BYTES / SG_CSUM_CHUNK; i++) {
		done = i * SG_CSUM_CHUNK;
		if (done >= total)
			break;
		o = off + done;
		n = total - done; /* a multiple of 4, at least 4 (done < total) */
		if (n > SG_CSUM_CHUNK)
			n = SG_CSUM_CHUNK;
		barrier_var(o);
		/* o + n <= SG_STORE_BYTES + SG_CSUM_CHUNK: inside the entry's data. */
		if (o > SG_STORE_BYTES)
			return -1;
		sum = bpf_csum_diff(NULL, 0, (__be32 *)(st->data + o), span_len(n, SG_CSUM_CHUNK),
				    (__wsum)sum);
		if (sum < 0)
			return sum;
	}
	return sum;
}

/* resend_build rewrites the tick's skb into the stored frame (IPv4 or IPv6 over Ethernet).
 * 0 or -1. */
static __always_inline int resend_build(struct __sk_buff *skb, struct sg_stored *st)
{
	__u32 len = st->len;
	__be16 proto;

	if (len < sizeof(struct ethhdr) || len > SG_STORE_BYTES)
		return -1;
	len = stored_len(len);
	__builtin_memcpy(&proto, st->data + offsetof(struct ethhdr, h_proto), sizeof(proto));
	if (proto != bpf_htons(ETH_P_IP) && proto != bpf_htons(ETH_P_IPV6))
		return -1;
	if (skb->protocol != proto && bpf_skb_change_proto(skb, proto, 0) < 0)
		return -1;
	if (bpf_skb_change_tail(skb, len, 0) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, 0, st->data, len, 0) < 0 ? -1 : 0;
}

/* resend_rewrite writes worker i's copy (to w) into the rebuilt request. 0 or negative. */
static __always_inline int resend_rewrite(struct __sk_buff *skb, struct resend_state *r,
					  const struct sg_worker *w, __u32 i)
{
	struct scatter_ctx *c = &r->c;
	__be16 worker = bpf_htons((__u16)i), port = w->port;
	__u64 sum = r->base + (__u16)port + (__u16)worker;
	__sum16 check;
	int err = 0;

	if (c->v6) {
		sum += csum_pseudo6((const struct in6_addr *)r->saddr, &w->addr, IPPROTO_UDP, r->udp_len);
		err |= bpf_skb_store_bytes(skb, c->l3_off + offsetof(struct ipv6hdr, daddr), &w->addr,
					   sizeof(w->addr), 0);
	} else {
		__be32 to = w->addr.in6_u.u6_addr32[3];

		sum += csum_pseudo4(r->saddr[0], to, IPPROTO_UDP, (__u16)r->udp_len);
		err |= bpf_l3_csum_replace(skb, c->l3_off + offsetof(struct iphdr, check), c->cur_addr[0], to, 4);
		c->cur_addr[0] = to;
		err |= bpf_skb_store_bytes(skb, c->l3_off + offsetof(struct iphdr, daddr), &to, 4, 0);
	}
	check = csum_udp_final(sum);
	err |= bpf_skb_store_bytes(skb, c->l4_off + offsetof(struct udphdr, dest), &port, 2, 0);
	err |= bpf_skb_store_bytes(skb, c->l4_off + offsetof(struct udphdr, check), &check, 2, 0);
	err |= bpf_skb_store_bytes(skb, c->hdr_off + offsetof(struct sg_hdr, worker), &worker, 2, 0);
	err |= bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_dest), w->mac, ETH_ALEN, 0);
	return err;
}

/* resend_send sends the copy the skb holds out of the group's interface (egress), its own
 * MAC written. A loopback group's copy goes round through the pacer veth's ingress instead,
 * where resend_out gives it a route: a packet to 127.0.0.0/8 (or ::1) that
 * arrives at lo without the route a local sender's has is a martian and dropped, and a
 * clone made at an ingress hook has none. Returns bpf_clone_redirect's result. */
static __always_inline long resend_send(struct __sk_buff *skb, struct resend_state *r)
{
	if (!r->c.loopback)
		return bpf_clone_redirect(skb, r->c.ifindex, 0);
	return bpf_clone_redirect(skb, pacer_cfg.ifindex, BPF_F_INGRESS);
}

/* skb->pkt_type of a packet to this host (linux/if_packet.h; not in vmlinux.h). */
#define SG_PACKET_HOST 0

/* A namespace's loopback device, the interface of every loopback group (the kernel's
 * LOOPBACK_IFINDEX: lo is the only device with IFF_LOOPBACK). Nothing else of the copy
 * survives the redirect to tell it: the kernel clears skb->priority there. */
#define SG_LOOPBACK_IFINDEX 1

/* resend_out (sg_resend, a loopback group's copy back from resend_send): out of lo with
 * bpf_redirect_neigh, which routes it (the local route: what a local sender's packet
 * carries) and fills in the L2 addresses. */
static __always_inline int resend_out(struct __sk_buff *skb)
{
	long ret;

	/* Received again on the veth, addressed to another MAC than its own: the kernel made it
	 * PACKET_OTHERHOST, which lo's receive path keeps (it re-marks only a foreign MAC) and
	 * ip_rcv drops. A veth's peer resets it; lo does not. */
	bpf_skb_change_type(skb, SG_PACKET_HOST);
	ret = bpf_redirect_neigh(SG_LOOPBACK_IFINDEX, NULL, 0, 0);

	if (ret != TC_ACT_REDIRECT) {
		COUNT(stats_for(NO_GROUP), resend_errors);
		return TC_ACT_SHOT;
	}
	return ret;
}

/* resend_cb (bpf_loop, one worker of a round): a copy again for a worker that has not
 * answered, paid by the budget, to its target. */
static long resend_cb(__u64 i, void *ctx)
{
	struct resend_ctx *x = ctx;
	struct resend_state *r = x->r;
	__u32 widx = (__u32)i, word, key, last = 0, rep = 0;
	struct sg_worker *w;
	__u64 mask;
	int picked, again, hedge;

	if (widx >= r->c.nworkers || widx >= SG_WORKERS_MAX)
		return 1;
	mask = worker_bit(widx, &word);
	if (READ_ONCE(x->s->res.bitmap[word]) & mask)
		return 0; /* answered */
	again = !!(x->st->resent[word] & mask);
	hedge = r->c.replicas && shard_spare(r->c.replica_base + widx);
	if (!budget_take(x->b, budget_keep(x->g, again, r->retries + r->hedges, hedge))) {
		r->refused++;
		return 0;
	}
	key = r->c.worker_base + widx;
	if (r->c.replicas) {
		last = rep_get(x->st->rep_last, widx);
		picked = shard_next(r->c.replica_base + widx, last, x->now);
		key = rep_key(picked);
		rep = rep_index(picked);
	}
	w = bpf_map_lookup_elem(&workers, &key);
	if (!w || resend_rewrite(x->skb, r, w, widx) < 0 || resend_send(x->skb, r) < 0) {
		budget_refund(x->b);
		r->errors++;
		return 0;
	}
	if (again) {
		r->again++;
	} else if (x->censors && quantile_claim_up(x->st, x->g)) {
		quantile_up(x->b, x->q_milli);
		r->censored++;
	}
	x->st->resent[word] |= mask;
	if (r->c.replicas)
		rep_set(x->st->rep_last, widx, rep);
	if (rep != last)
		r->hedges++;
	else
		r->retries++;
	return 0;
}

/* resend_slot sends slot's round of re-sends when it is due (see the top of this file).
 * A global function: the verifier checks it once, not once per state of the tick's loop. */
__attribute__((noinline)) int resend_slot(struct __sk_buff *skb, __u32 slot, __u64 now)
{
	struct sg_stored *st = bpf_map_lookup_elem(&stored, &slot);
	struct sg_slot *s = bpf_map_lookup_elem(&slots, &slot);
	struct resend_ctx x = {};
	struct resend_state *r;
	struct sg_stats *cnt;
	struct sg_group *g;
	struct sg_hdr h;
	__u64 due, next;
	__u32 gid, rounds, zero = 0;
	__u16 ulen;
	__s64 sum;
	int err;

	if (!st || !s)
		return 0;
	due = READ_ONCE(st->due_ns);
	if (!due)
		return 0;
	if (READ_ONCE(s->res.req_id) != READ_ONCE(st->req_id) || READ_ONCE(s->state) != SG_SLOT_PENDING) {
		__sync_val_compare_and_swap(&st->due_ns, due, 0); /* spent */
		return 0;
	}
	if (!pacer_due(due, now, 0))
		return 0;
	gid = READ_ONCE(s->res.group);
	g = gid < SG_GROUPS_MAX ? bpf_map_lookup_elem(&groups, &gid) : NULL;
	x.b = bpf_map_lookup_elem(&budgets, &gid);
	r = bpf_map_lookup_elem(&resend_state, &zero);
	if (!g || !x.b || !r)
		return 0;
	rounds = st->rounds + 1;
	next = rounds < g->resend_max ? now + resend_again_delay(g, x.b) : 0;
	if (__sync_val_compare_and_swap(&st->due_ns, due, next) != due)
		return 0; /* another CPU's tick took the round */
	st->rounds = rounds;
	cnt = stats_for(gid);
	COUNT(cnt, resend_rounds);
	if (now > due)
		COUNT_N(cnt, resend_late_ns, now - due);
	if (resend_build(skb, st) < 0 || parse_request(skb, &r->c, &h) != 1 || r->c.gid != gid) {
		COUNT(cnt, resend_errors);
		return 0;
	}
	sum = stored_sum(st, r->c.l4_off, st->len);
	err = bpf_skb_load_bytes(skb, r->c.l4_off + offsetof(struct udphdr, len), &ulen, sizeof(ulen));
	if (r->c.v6)
		err |= bpf_skb_load_bytes(skb, r->c.l3_off + offsetof(struct ipv6hdr, saddr), r->saddr, 16);
	else
		err |= bpf_skb_load_bytes(skb, r->c.l3_off + offsetof(struct iphdr, saddr), r->saddr, 4);
	if (sum < 0 || err < 0) {
		COUNT(cnt, resend_errors);
		return 0;
	}
	/* The copies' port and worker index replace the stored ones (RFC 1624). */
	r->base = (__u64)(__u32)sum + (__u16)~r->c.cur_port + (__u16)~r->c.cur_worker;
	r->udp_len = bpf_ntohs(ulen);
	r->retries = 0;
	r->hedges = 0;
	r->refused = 0;
	r->errors = 0;
	r->again = 0;
	r->censored = 0;
	x.skb = skb;
	x.s = s;
	x.st = st;
	x.r = r;
	x.now = now;
	x.g = g;
	x.q_milli = g->resend_quantile_milli;
	x.censors = quantile_censors(g, x.b, st->sent_ns, now);
	skb->mark = sg_cfg.copy_mark; /* the copies pass the scatter untouched */
	bpf_loop(SG_WORKERS_MAX, resend_cb, &x, 0);
	COUNT_N(cnt, retries, r->retries);
	COUNT_N(cnt, hedges, r->hedges);
	COUNT_N(cnt, resend_refused, r->refused);
	COUNT_N(cnt, resend_errors, r->errors);
	COUNT_N(cnt, resend_again, r->again);
	COUNT_N(cnt, resend_censored, r->censored);
	return 0;
}

/* What one tick's scan of the slots works with. */
struct resend_scan {
	struct __sk_buff *skb;
	__u64 now;
	__u64 next; /* the earliest round still to come (0: none) */
};

static long resend_scan_cb(__u64 i, void *ctx)
{
	struct resend_scan *l = ctx;
	__u32 slot = (__u32)i;
	struct sg_stored *st;
	__u64 d;

	resend_slot(l->skb, slot, l->now);
	st = bpf_map_lookup_elem(&stored, &slot);
	if (!st)
		return 1; /* the map's end: no group re-sends (one entry) */
	d = READ_ONCE(st->due_ns);
	if (d && (!l->next || d < l->next))
		l->next = d;
	return 0;
}

/* resend (sg_resend, a pacer tick): every due round of every stored request, then the next
 * tick. Anything else arriving on the pacer's veth is not ours: passed. */
static __always_inline int resend(struct __sk_buff *skb)
{
	struct resend_scan l = { .skb = skb };
	struct pacer_tick tick;

	/* A loopback group's copy, cloned back in by resend_send: same namespace, so it keeps
	 * its mark (a tick from the pacer's namespace loses any). */
	if (skb->mark == sg_cfg.copy_mark)
		return resend_out(skb);
	switch (pacer_receive(skb, &tick)) {
	case PACER_RX_TICK:
		break;
	case PACER_RX_MALFORMED:
		return TC_ACT_SHOT; /* counted by the pacer */
	default:
		return TC_ACT_UNSPEC;
	}
	l.now = kedge_now();
	bpf_loop(SG_SLOTS, resend_scan_cb, &l, 0);
	/* The tick for the next round is a clone of this skb: give back the 20 bytes an IPv6
	 * rebuild pushed, or the offsets it keeps from its first packet drift on by 20 at
	 * every tick (and bpf_skb_change_tail soon refuses to cut it to a frame). */
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		bpf_skb_change_proto(skb, bpf_htons(ETH_P_IP), 0);
	if (l.next)
		pacer_request(skb, l.next);
	return TC_ACT_SHOT;
}

#endif /* KEDGE_SG_RESEND_H */
