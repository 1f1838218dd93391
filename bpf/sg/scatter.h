/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* scatter.h - TC egress: one request datagram becomes one copy per worker.
 *
 * Each copy is the request with the destination address, UDP port, destination MAC and
 * the header's worker index rewritten, checksums updated incrementally (bpf_l3/l4_csum_
 * replace keep CHECKSUM_PARTIAL and CHECKSUM_COMPLETE skbs right), then sent with
 * bpf_clone_redirect to the group's interface egress. The copies carry sg_cfg.copy_mark, so
 * when they pass this hook again they go through untouched; that keeps one program looping
 * bpf_clone_redirect at transmit recursion depth 1 (Electrode's TC broadcast), instead of
 * a chain of re-entries that would hit the kernel's limit of 8. The original is dropped.
 *
 * Writing into the original after a clone makes the kernel copy its head first (the clone
 * shares it), so every copy leaves with its own bytes. */
#ifndef KEDGE_SG_SCATTER_H
#define KEDGE_SG_SCATTER_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "counters.h"
#include "csum.h"
#include "parse.h"
#include "sg.h"
#include "maps.h"
#include "expire.h"
#include "replica.h"
#include "stored.h"

/* What the per-worker loop needs. Plain scalars: the bounded-loop tier keeps it in a
 * per-CPU map between tail calls, where pointers cannot be stored. */
struct scatter_ctx {
	__u32 gid;
	__u32 nworkers;
	__u32 worker_base;
	__u32 ifindex;
	__u32 l3_off;
	__u32 l4_off;
	__u32 hdr_off;     /* the sg header */
	__u32 v6;
	__be32 cur_addr[4]; /* destination now in the packet (IPv4: [0]) */
	__be16 cur_port;
	__be16 cur_worker;
	__u32 next;        /* first worker of this batch (bounded tier: of the next chunk) */
	__u32 end;         /* one past the last worker of this batch */
	__u32 slot_base;   /* the group's slots, elements and deadline */
	__u32 nslots;
	__u32 elems;
	__u32 loopback;    /* SG_GF_LOOPBACK: hand batches on through egress */
	__u64 timeout_ns;
	__u32 copies;
	__u32 errors;
	/* SG_GF_REPLICAS: the shards' entries, the round robin's position (req_id /
	 * SG_SLOTS) and the time replicas are judged at (replica.h). */
	__u32 replicas;
	__u32 replica_base;
	__u32 rr;
	/* SG_GF_RESEND: the request is stored for re-sends (resend.h), with the replica of
	 * each first copy when the group has replicas. */
	__u32 resend;
	__u64 now;
	__u64 id;
	__u32 slot;
	__u32 _pad;
	__u32 cur_mac_lo;  /* destination MAC now in the packet: bytes 0-3, */
	__u32 cur_mac_hi;  /* bytes 4-5 */
};

struct loop_ctx {
	struct __sk_buff *skb;
	struct scatter_ctx *c;
};

/* rewrite_to rewrites the request for worker w (index i); 0 or a negative error.
 * The UDP port and the header's worker index change with every copy: both lie at even
 * offsets of the datagram, so one 32-bit checksum replace covers the two (a one's-complement
 * sum is the sum of its 16-bit words, in any order). The address and the MAC are rewritten
 * only when they differ from what the packet holds (on loopback, and behind one router,
 * they never do after the first copy). */
static __always_inline int rewrite_to(struct __sk_buff *skb, struct scatter_ctx *c,
				      const struct sg_worker *w, __u32 i)
{
	__u32 csum_off = c->l4_off + offsetof(struct udphdr, check);
	__be16 worker = bpf_htons((__u16)i);
	__be16 port = w->port;
	__u16 from[2] = { c->cur_port, c->cur_worker };
	__u16 to[2] = { port, worker };
	__u32 from_w, to_w, mac_lo, mac_hi_w;
	__u16 mac_hi;
	int err = 0;

	if (c->v6) {
		if (c->cur_addr[0] != w->addr.in6_u.u6_addr32[0] ||
		    c->cur_addr[1] != w->addr.in6_u.u6_addr32[1] ||
		    c->cur_addr[2] != w->addr.in6_u.u6_addr32[2] ||
		    c->cur_addr[3] != w->addr.in6_u.u6_addr32[3]) {
			err |= bpf_l4_csum_replace(skb, csum_off, c->cur_addr[0],
						   w->addr.in6_u.u6_addr32[0], L4_CSUM_ADDR_FLAGS(1) | 4);
			err |= bpf_l4_csum_replace(skb, csum_off, c->cur_addr[1],
						   w->addr.in6_u.u6_addr32[1], L4_CSUM_ADDR_FLAGS(1) | 4);
			err |= bpf_l4_csum_replace(skb, csum_off, c->cur_addr[2],
						   w->addr.in6_u.u6_addr32[2], L4_CSUM_ADDR_FLAGS(1) | 4);
			err |= bpf_l4_csum_replace(skb, csum_off, c->cur_addr[3],
						   w->addr.in6_u.u6_addr32[3], L4_CSUM_ADDR_FLAGS(1) | 4);
			__builtin_memcpy(c->cur_addr, &w->addr, sizeof(c->cur_addr));
			err |= bpf_skb_store_bytes(skb, c->l3_off + offsetof(struct ipv6hdr, daddr),
						   c->cur_addr, sizeof(c->cur_addr), 0);
		}
	} else {
		__be32 to4 = w->addr.in6_u.u6_addr32[3];

		if (c->cur_addr[0] != to4) {
			err |= bpf_l4_csum_replace(skb, csum_off, c->cur_addr[0], to4,
						   L4_CSUM_ADDR_FLAGS(1) | 4);
			err |= bpf_l3_csum_replace(skb, c->l3_off + offsetof(struct iphdr, check),
						   c->cur_addr[0], to4, 4);
			c->cur_addr[0] = to4;
			err |= bpf_skb_store_bytes(skb, c->l3_off + offsetof(struct iphdr, daddr),
						   &to4, 4, 0);
		}
	}
	__builtin_memcpy(&from_w, from, 4);
	__builtin_memcpy(&to_w, to, 4);
	err |= bpf_l4_csum_replace(skb, csum_off, from_w, to_w, BPF_F_MARK_MANGLED_0 | 4);
	c->cur_port = port;
	c->cur_worker = worker;
	err |= bpf_skb_store_bytes(skb, c->l4_off + offsetof(struct udphdr, dest), &port, 2, 0);
	err |= bpf_skb_store_bytes(skb, c->hdr_off + offsetof(struct sg_hdr, worker), &worker, 2, 0);
	/* MACs are not covered by any checksum. */
	__builtin_memcpy(&mac_lo, w->mac, 4);
	__builtin_memcpy(&mac_hi, w->mac + 4, 2);
	mac_hi_w = mac_hi;
	if (mac_lo != c->cur_mac_lo || mac_hi_w != c->cur_mac_hi) {
		err |= bpf_skb_store_bytes(skb, offsetof(struct ethhdr, h_dest), w->mac, ETH_ALEN, 0);
		c->cur_mac_lo = mac_lo;
		c->cur_mac_hi = mac_hi_w;
	}
	return err;
}

/* scatter_one sends the copy for worker i. Returns 1 (stop) past the batch's last worker.
 * resend: the bpf_loop tier, where a group may re-send (the replica of each copy is noted
 * for it); 0 in the bounded tier, which then verifies what it did without re-sends. */
static __always_inline long scatter_one(struct __sk_buff *skb, __u32 i, struct scatter_ctx *c,
					const int resend)
{
	struct sg_worker *w;
	int picked = 0;
	__u32 key;

	if (i >= c->end)
		return 1;
	key = c->worker_base + i;
	if (c->replicas) { /* the replica's entry (replica.h); -1: none, the lookup fails */
		picked = shard_pick(c->replica_base + i, c->rr + i, c->now, c->gid);
		key = rep_key(picked);
	}
	w = bpf_map_lookup_elem(&workers, &key);
	if (!w || rewrite_to(skb, c, w, i) < 0 ||
	    bpf_clone_redirect(skb, c->ifindex, 0) < 0) {
		c->errors++;
		return 0;
	}
	c->copies++;
	if (resend && c->replicas && c->resend)
		stored_first_replica(c->slot, i, rep_index(picked));
	return 0;
}

static long scatter_cb(__u64 i, void *ctx)
{
	struct loop_ctx *l = ctx;

	return scatter_one(l->skb, l->c->next + (__u32)i, l->c, 1);
}

/* parse_request parses a request datagram of a configured group sent by the group's
 * socket and fills c from it (addresses now in the packet, group, offsets). Returns 1, or
 * the TC verdict to return. */
static __always_inline int parse_request(struct __sk_buff *skb, struct scatter_ctx *c,
					 struct sg_hdr *out)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct sg_stats *gcnt = stats_for(NO_GROUP);
	struct sg_hdr *h;
	struct sg_group *g;
	struct pkt p;
	__u32 gid, udp_payload, hoff;
	int perr;

	perr = parse_pkt(data, data_end, &p);
	if (perr != PARSE_OK || p.l4_proto != IPPROTO_UDP || (p.flags & PKT_F_FRAG))
		return TC_ACT_UNSPEC; /* not a request: kedge sg only looks at whole UDP datagrams */
	udp_payload = p.payload_len;
	hoff = p.payload_off;
	h = pkt_hdr(data, data_end, hoff, sizeof(__be16));
	if (!h || h->magic != bpf_htons(SG_MAGIC))
		return TC_ACT_UNSPEC;
	h = pkt_hdr(data, data_end, hoff, sizeof(*h));
	if (!h || udp_payload < sizeof(*h)) {
		COUNT(gcnt, malformed);
		return TC_ACT_UNSPEC;
	}
	if (h->version != SG_VERSION) {
		COUNT(gcnt, bad_version);
		return TC_ACT_UNSPEC;
	}
	if (h->op != SG_OP_REQUEST)
		return TC_ACT_UNSPEC; /* a reply leaving (this host is also a worker) */
	if (bpf_ntohl(h->payload_len) > udp_payload - sizeof(*h)) {
		COUNT(gcnt, malformed);
		return TC_ACT_UNSPEC;
	}
	gid = bpf_ntohs(h->group);
	g = gid < SG_GROUPS_MAX ? bpf_map_lookup_elem(&groups, &gid) : NULL;
	if (!g || !g->enabled) {
		COUNT(gcnt, unknown_group);
		return TC_ACT_UNSPEC;
	}
	if (p.sport != g->coord_port || !in6_addr_eq(&p.saddr, &g->coord_addr) ||
	    (g->family == 4) != (p.l3_proto == ETH_P_IP)) {
		COUNT(stats_for(gid), not_owner);
		return TC_ACT_UNSPEC;
	}
	__builtin_memcpy(out, h, sizeof(*out));
	c->gid = gid;
	c->nworkers = g->nworkers;
	c->worker_base = g->worker_base;
	c->ifindex = g->ifindex;
	c->next = 0;
	c->end = 0;
	c->slot_base = g->slot_base;
	c->nslots = g->nslots;
	c->elems = g->elems;
	c->loopback = g->flags & SG_GF_LOOPBACK;
	c->timeout_ns = g->timeout_ns;
	c->l3_off = p.l3_off;
	c->l4_off = p.l4_off;
	c->hdr_off = hoff;
	c->v6 = p.l3_proto == ETH_P_IPV6;
	if (c->v6)
		__builtin_memcpy(c->cur_addr, &p.daddr, sizeof(c->cur_addr));
	else
		c->cur_addr[0] = p.daddr.in6_u.u6_addr32[3];
	c->cur_port = p.dport;
	c->cur_worker = h->worker;
	{
		struct ethhdr *eth = data;
		__u16 hi;

		if ((void *)(eth + 1) > data_end)
			return TC_ACT_UNSPEC;
		__builtin_memcpy(&c->cur_mac_lo, eth->h_dest, 4);
		__builtin_memcpy(&hi, eth->h_dest + 4, 2);
		c->cur_mac_hi = hi;
	}
	c->copies = 0;
	c->errors = 0;
	/* Every field, replicas or not: the bounded tier keeps c in a map, the other on the
	 * stack, where 5.10's verifier refuses reads of bytes never written. */
	c->replicas = !!(g->flags & SG_GF_REPLICAS);
	c->replica_base = g->replica_base;
	c->rr = (__u32)(bpf_be64_to_cpu(h->req_id) / SG_SLOTS);
	c->resend = !!(g->flags & SG_GF_RESEND);
	c->now = c->replicas ? kedge_now() : 0;
	c->id = bpf_be64_to_cpu(h->req_id);
	c->slot = (__u32)c->id & SG_SLOT_MASK;
	c->_pad = 0;
	return 1;
}

/* batch_end is the end of the batch that starts at worker next: sg_cfg.first_batch copies
 * for the first, then as many as were sent before it (doubling), at most sg_cfg.batch. */
static __always_inline __u32 batch_end(const struct scatter_ctx *c, __u32 next)
{
	__u32 batch = next < sg_cfg.batch ? next : sg_cfg.batch;

	if (batch < sg_cfg.first_batch)
		batch = sg_cfg.first_batch;
	if (batch < 1)
		batch = 1;

	return next + batch < c->nworkers ? next + batch : c->nworkers;
}

/* scatter_prepare parses a request, checks it belongs to a configured group and was sent
 * by the group's socket, and arms its slot. Returns 1 when the copies should be sent
 * (c filled), or the TC verdict to return. */
static __always_inline int scatter_prepare(struct __sk_buff *skb, struct scatter_ctx *c,
					   const int use_timer)
{
	struct sg_stats *cnt;
	struct sg_slot *s;
	struct sg_hdr h;
	__u32 slot;
	__u64 id, now, timeout;
	__u16 need;
	int ret;

	if (skb->mark == sg_cfg.copy_mark || skb->mark == sg_cfg.cont_mark)
		return TC_ACT_UNSPEC; /* our copies, or a batch handed on (loopback), passing again */
	ret = parse_request(skb, c, &h);
	if (ret != 1)
		return ret;
	if (!use_timer)
		c->resend = 0; /* the bounded tier does not re-send (resend.h) */
	cnt = stats_for(c->gid);
	COUNT(cnt, requests);
	id = bpf_be64_to_cpu(h.req_id);
	slot = id & SG_SLOT_MASK;
	if (slot < c->slot_base || slot >= c->slot_base + c->nslots) {
		COUNT(cnt, slot_range);
		return TC_ACT_SHOT;
	}
	need = bpf_ntohs(h.need);
	if (need == 0 || need > c->nworkers)
		need = c->nworkers;
	timeout = bpf_ntohl(h.timeout_us) * 1000ULL;
	if (!timeout)
		timeout = c->timeout_ns;
	c->end = batch_end(c, 0);

	s = bpf_map_lookup_elem(&slots, &slot);
	if (!s)
		return TC_ACT_SHOT;
	now = bpf_ktime_get_ns();
	bpf_spin_lock(&s->lock);
	if (s->state == SG_SLOT_PENDING) {
		bpf_spin_unlock(&s->lock);
		COUNT(cnt, slot_busy);
		return TC_ACT_SHOT;
	}
	s->state = SG_SLOT_PENDING;
	s->deadline_ns = now + timeout;
	s->res.req_id = id;
	s->res.start_ns = now;
	s->res.done_ns = 0;
	s->res.group = c->gid;
	s->res.slot = slot;
	s->res.status = SG_ST_OK;
	s->res.count = 0;
	s->res.need = need;
	s->res.flags = 0;
	s->res.gathered = 0;
	s->res.partial = 0; /* one 32-bit store with gathered */
	__builtin_memset(s->res.bitmap, 0, sizeof(s->res.bitmap));
	/* Only the accumulators this group uses (a loop clang cannot turn into memset). */
	for (__u32 i = 0; i < SG_AGG_ELEMS; i++) {
		__u32 k = i;

		if (i >= c->elems)
			break;
		barrier_var(k); /* no memset idiom; the mask bounds k for the verifier */
		s->res.agg[k & (SG_AGG_ELEMS - 1)] = 0;
	}
	bpf_spin_unlock(&s->lock);
	if (use_timer)
		arm_expiry(s, timeout, cnt);
	skb->mark = sg_cfg.copy_mark; /* inherited by every clone */
	return 1;
}

/* cont_prepare picks up a request handed on by scatter_finish (at the group interface's
 * ingress): the packet still holds the last copy's destination and worker index, so the
 * next batch starts after it. Its slot must still hold the request, pending: a request
 * completed (N of M) or expired needs no more copies. Returns 1 or the TC verdict. */
static __always_inline int cont_prepare(struct __sk_buff *skb, struct scatter_ctx *c)
{
	struct sg_slot *s;
	struct sg_hdr h;
	__u32 slot, next;
	__u64 id;
	int ret;

	if (skb->mark != sg_cfg.cont_mark)
		return TC_ACT_UNSPEC; /* anything else arriving: not ours here */
	ret = parse_request(skb, c, &h);
	if (ret != 1)
		return ret;
	if (skb->ifindex != c->ifindex)
		return TC_ACT_UNSPEC;
	id = bpf_be64_to_cpu(h.req_id);
	slot = id & SG_SLOT_MASK;
	next = (__u32)bpf_ntohs(h.worker) + 1;
	s = bpf_map_lookup_elem(&slots, &slot);
	if (!s || s->res.req_id != id || s->state != SG_SLOT_PENDING || next >= c->nworkers) {
		COUNT(stats_for(c->gid), cont_stopped);
		return TC_ACT_SHOT;
	}
	c->next = next;
	c->end = batch_end(c, next);
	skb->mark = sg_cfg.copy_mark;
	return 1;
}

/* scatter_finish counts the copies; then it hands the request on to the next batch
 * (sg_cfg.batch) or drops the original. */
static __always_inline int scatter_finish(struct __sk_buff *skb, struct scatter_ctx *c)
{
	struct sg_stats *cnt = stats_for(c->gid < SG_GROUPS_MAX ? c->gid : NO_GROUP);

	COUNT_N(cnt, copies, c->copies);
	COUNT_N(cnt, copy_errors, c->errors);
	if (c->end < c->nworkers) {
		COUNT(cnt, continued);
		skb->mark = sg_cfg.cont_mark;
		/* Either way it waits in the backlog behind this batch and comes back to the
		 * interface's ingress, where sg_scatter_cont takes it. */
		return bpf_redirect(c->ifindex, c->loopback ? 0 : BPF_F_INGRESS);
	}
	return TC_ACT_SHOT;
}

#endif /* KEDGE_SG_SCATTER_H */
