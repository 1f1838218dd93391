/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* store.h - the stored path's store: store, don't clone (docs/hedging.md, Data path).
 *
 * The splitter copies a request's IP header, UDP header and payload (payload <=
 * svc_cfg.store_limit) into a cell of its service's store ring and asks the pacer for a tick
 * at the ring head's deadline; the request itself leaves untouched and nothing is cloned.
 * At a tick the rescuer (tick.h) pops every due cell of every service and hedges it (send.h).
 * A request that may have more hedges (svc_cfg.max_hedges) is queued again at now + its delay
 * (store_requeue). Then the rescuer asks for a tick at the earliest deadline still waiting;
 * with nothing waiting nothing ticks.
 *
 * Ordering. A ring is a FIFO of deadlines (send time + delay), and the rescuer looks only at
 * each ring's head: a cell is sent when it and every cell before it are due. With a fixed
 * delay deadlines arrive in send order (up to the nanoseconds between two CPUs' clocks and
 * their tail claims). The adaptive delay changes the delay of new requests only: a longer
 * delay gives a later deadline than its predecessor's (fine); a shorter one an earlier deadline
 * that waits behind the older, later ones - in effect clamped up to its predecessor's
 * deadline, by at most old delay - new delay, for the requests sent within that time after
 * the change (the delay changes at most once per tick_ns). A re-queued request (a further
 * hedge) is clamped the same way. Hedges are never sent early.
 *
 * The ring (one per service, STORE_RING cells): a multi-producer queue with per-cell laps
 * (kept in store_laps, apart from the cells: see struct hstore).
 * Position pos maps to cell pos % STORE_RING; the cell is empty for pos while lap ==
 * 2 * (pos / STORE_RING) and filled when lap is one more. A splitter claims the tail by
 * compare-and-exchange when its cell is empty (else the ring is full), fills it and publishes
 * it (lap + 1, an atomic exchange: the cell's bytes are visible before). The rescuer claims
 * the head the same way when its cell is filled and due, uses it in place and releases it
 * (lap + 2: empty for the position one lap on). No cell is ever skipped: a splitter that
 * claimed a cell publishes it even when copying failed (len 0: the rescuer drops it). */
#ifndef KEDGE_HEDGE_STORE_H
#define KEDGE_HEDGE_STORE_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "counters.h"
#include "parse.h"
#include "hedge.h"
#include "maps.h"
#include "budget.h"
#include "match.h"
#include "pacer_client.h"

enum store_result {
	STORE_OK = 0,
	STORE_TOO_LARGE,
	STORE_FULL,
	STORE_UNSUPPORTED,
};

static __always_inline struct hstore *ring_cell(__u32 svc, __u64 pos)
{
	__u32 idx = svc * STORE_RING + (__u32)(pos & (STORE_RING - 1));

	return bpf_map_lookup_elem(&store_ring, &idx);
}

/* ring_lap: the lap of svc's cell at pos (an array lookup, inlined by the verifier). */
static __always_inline struct store_lap *ring_lap(__u32 svc, __u64 pos)
{
	__u32 idx = svc * STORE_RING + (__u32)(pos & (STORE_RING - 1));

	return bpf_map_lookup_elem(&store_laps, &idx);
}

/* ring_filled: svc's cell at pos holds the request of pos (published, not yet released). */
static __always_inline int ring_filled(__u32 svc, __u64 pos)
{
	struct store_lap *l = ring_lap(svc, pos);

	return l && READ_ONCE(l->lap) == pos / STORE_RING * 2 + 1;
}

static __always_inline __u64 lap_empty(__u64 pos)
{
	return pos / STORE_RING * 2;
}

/* ring_claim returns svc's tail cell, claimed for the caller at *pos, or NULL when the ring
 * is full (or other CPUs kept claiming). The caller must ring_publish it. Only the lap is
 * read before the claim; the cell is looked up once, after it (store_ring and store_laps
 * have the same size, so the cell of a lap that exists exists: Hedger.load sizes both). */
static __always_inline struct hstore *ring_claim(__u32 svc, __u64 *pos)
{
	struct store_pos *sp = bpf_map_lookup_elem(&store_heads, &svc);
	struct store_lap *lp;
	__u64 t, lap;

	if (!sp)
		return NULL;
	for (int i = 0; i < 4; i++) {
		t = READ_ONCE(sp->tail);
		lp = ring_lap(svc, t);
		if (!lp)
			return NULL;
		lap = READ_ONCE(lp->lap);
		if (lap < lap_empty(t))
			return NULL; /* the rescuer still holds the cell a lap back: full */
		if (lap == lap_empty(t) && __sync_val_compare_and_swap(&sp->tail, t, t + 1) == t) {
			*pos = t;
			return ring_cell(svc, t);
		}
	}
	return NULL;
}

/* ring_publish publishes cell c at pos: its owner (send time, key) beside its lap first. */
static __always_inline void ring_publish(__u32 svc, __u64 pos, const struct hstore *c)
{
	struct store_lap *l = ring_lap(svc, pos);

	if (!l)
		return;
	l->sent_ns = c->sent_ns;
	l->key = c->key;
	__sync_lock_test_and_set(&l->lap, lap_empty(pos) + 1);
}

static __always_inline void ring_release(__u32 svc, __u64 pos)
{
	struct store_lap *l = ring_lap(svc, pos);

	if (l)
		__sync_lock_test_and_set(&l->lap, lap_empty(pos) + 2);
}

/* store_finish zeroes what follows the bytes (the checksum reads whole 4-byte words) and the
 * UDP checksum field (computed anew for each hedge), and publishes the cell. */
static __always_inline void store_finish(struct hstore *c, __u32 svc, __u64 pos, __u32 len, __u32 l3)
{
	if (len >= l3 + sizeof(struct udphdr) && len <= STORE_BYTES) {
		barrier_var(len);
		if (len <= STORE_BYTES) {
			c->data[len] = 0;
			c->data[len + 1] = 0;
			c->data[len + 2] = 0;
			c->data[len + 3] = 0;
		}
		l3 = l3 == sizeof(struct ipv6hdr) ? sizeof(struct ipv6hdr) : sizeof(struct iphdr);
		c->data[l3 + offsetof(struct udphdr, check)] = 0;
		c->data[l3 + offsetof(struct udphdr, check) + 1] = 0;
	} else {
		len = 0;
	}
	c->len = len;
	ring_publish(svc, pos, c);
}

/* store_request (splitter): stores the request m matched (scoreboard entry r written
 * already) for a hedge from a tick and asks the pacer for one. STORE_OK: stored; otherwise
 * the reason the caller clones it instead. */
static __always_inline int store_request(struct __sk_buff *skb, struct match *m, const struct hreq *r)
{
	struct pkt *p = &m->p;
	struct hstore *c;
	__u32 l3, len;
	__u64 pos;

	if (p->payload_len > m->cfg->store_limit || p->payload_len > STORE_PAYLOAD_MAX)
		return STORE_TOO_LARGE;
	if (p->flags & (PKT_F_VLAN | PKT_F_IP_OPTS | PKT_F_IP6_EXT))
		return STORE_UNSUPPORTED;
	l3 = p->l3_proto == ETH_P_IPV6 ? sizeof(struct ipv6hdr) : sizeof(struct iphdr);
	if (p->l4_off != p->l3_off + l3)
		return STORE_UNSUPPORTED;
	len = l3 + sizeof(struct udphdr) + p->payload_len;
	c = ring_claim(m->svc, &pos);
	if (!c)
		return STORE_FULL;
	c->key = m->key;
	c->sent_ns = r->sent_ns;
	c->deadline_ns = r->deadline_ns;
	c->delay_ns = r->deadline_ns - r->sent_ns;
	c->l3_len = l3;
	c->ipv6 = l3 == sizeof(struct ipv6hdr);
	if (len > STORE_BYTES || bpf_skb_load_bytes(skb, p->l3_off, c->data, store_len(len)) < 0)
		len = 0; /* published empty: the rescuer drops it, the ring has no hole */
	store_finish(c, m->svc, pos, len, l3);
	if (!len)
		return STORE_UNSUPPORTED;
	/* Stored (and published) before the request (docs/pacer.md: ordering). */
	pacer_request_at(skb, r->deadline_ns, r->sent_ns);
	return STORE_OK;
}

/* key_eq compares two scoreboard keys (32 bytes, 8-byte aligned) word by word. */
static __always_inline int key_eq(const struct hreq_key *a, const struct hreq_key *b)
{
	const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;

	for (int i = 0; i < (int)(sizeof(*a) / 8); i++)
		if (x[i] != y[i])
			return 0;
	return 1;
}

/* store_answered (response path): the first response to a stored request whose cell is the
 * head of its service's ring pops the cell at once and deletes the scoreboard entry - the
 * usual case, a service that answers in order - so that no tick is needed for it: ticks come
 * only for requests still waiting at their deadline (store_tick). A cell that is not the head
 * (answered out of order) is popped by the next tick instead. 1: popped. */
static __always_inline int store_answered(struct match *m, const struct hreq *e)
{
	struct store_pos *sp = bpf_map_lookup_elem(&store_heads, &m->svc);
	struct store_lap *l;
	__u64 h;

	if (!sp)
		return 0;
	h = READ_ONCE(sp->head);
	l = ring_lap(m->svc, h);
	/* The head's owner from its lap entry (the cell itself is not read): a head popped
	 * meanwhile fails the exchange below. */
	if (!l || READ_ONCE(l->lap) != lap_empty(h) + 1 || l->sent_ns != e->sent_ns || !key_eq(&l->key, &m->key))
		return 0;
	if (__sync_val_compare_and_swap(&sp->head, h, h + 1) != h)
		return 0; /* a tick took it */
	ring_release(m->svc, h);
	bpf_map_delete_elem(&scoreboard, &m->key);
	budget_release(m->cfg, m->st);
	COUNT(m->cnt, stored_answered);
	return 1;
}

/* cell_waits: the request of a cell that is not due yet may still need its hedge (its
 * scoreboard entry is this request's, pending or hedged with more to come). A cell that
 * does not wait (answered, evicted, replaced) is popped at a tick before its deadline. */
static __always_inline int cell_waits(struct hstore *c)
{
	struct hreq *e = bpf_map_lookup_elem(&scoreboard, &c->key);

	return e && e->sent_ns == c->sent_ns && (e->state == REQ_PENDING || e->state == REQ_HEDGED);
}

/* store_requeue queues the request of cell c (popped, still held) again for a further hedge,
 * due at now + its delay: a new cell at its ring's tail with c's bytes. 0, or -1 when the
 * ring is full. */
static __always_inline int store_requeue(__u32 svc, struct hstore *c, __u64 now)
{
	struct hstore *n;
	__u32 len = c->len, words;
	__u64 pos;

	n = ring_claim(svc, &pos);
	if (!n)
		return -1;
	n->key = c->key;
	n->sent_ns = c->sent_ns;
	n->delay_ns = c->delay_ns;
	n->deadline_ns = now + c->delay_ns;
	n->l3_len = c->l3_len;
	n->ipv6 = c->ipv6;
	if (len > STORE_BYTES)
		len = 0;
	/* Whole words, the cell's data being 8-byte aligned (struct hstore). */
	words = (len + 7) / 8;
	for (__u32 i = 0; i < STORE_BYTES / 8; i++) {
		if (i >= words)
			break;
		((__u64 *)n->data)[i] = ((__u64 *)c->data)[i];
	}
	store_finish(n, svc, pos, len, c->l3_len);
	return len ? 0 : -1;
}

#endif /* KEDGE_HEDGE_STORE_H */
