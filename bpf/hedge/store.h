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
 * The ring (one per service, STORE_RING cells): a multi-producer queue with per-cell lap
 * words (kept in store_laps, apart from the cells: see struct hstore). Position pos maps to
 * cell pos % STORE_RING; the cell's word is (pos / STORE_RING) << LAP_STATE_BITS | state
 * (enum lap_state): LAP_EMPTY for pos, free to claim; filled for pos in any other state. A
 * splitter claims the tail by compare-and-exchange when its cell is empty (else the ring is
 * full), fills it and publishes it (an atomic exchange: the cell's bytes are visible before).
 * The rescuer claims the head the same way when its cell is due or done with, uses it in
 * place and releases it (LAP_EMPTY of the next lap). No cell is ever skipped: a splitter
 * that claimed a cell publishes it even when copying failed (len 0: the rescuer drops it).
 *
 * Where a stored request's state lives. Published, it is LAP_PENDING and lives in its cell
 * only: the splitter writes no scoreboard entry for it. Its first response finds it among the
 * ring's cells from head to tail (store_claim: the lap words and keys, nearest the head
 * first) and claims it there (LAP_PENDING -> LAP_ANSWERED, compare-and-exchange on the word);
 * an answered cell at the head is popped by that response (store_pop_answered), one behind
 * it by a later response or tick. Only a request still pending at its deadline enters the
 * scoreboard: the tick writes its entry and then moves the word LAP_PENDING -> LAP_MOVED
 * (store_move), both before it pops the cell, so a response finds the request in the ring
 * or in the scoreboard at every moment; from LAP_MOVED on the entry decides, as on the clone
 * path (claims, hedges, duplicates). A re-queued further hedge is published LAP_MOVED. A
 * scoreboard entry is thus written per hedged (or refused) request, not per request.
 *
 * A stalled request at the head. Popped in order, a ring would hold every request behind a
 * pending head until its deadline, answered or not (rate x delay of them), and a response's
 * search would run from that head. The first response behind a ring STORE_PARK_DEPTH deep
 * whose head is still pending parks the head (store_park): into the scoreboard, as at its
 * deadline, and its bytes into the service's park ring (LAP_MOVED, same deadline), which the
 * tick pops like a store ring. */
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

/* Ring ids: ring svc is service svc's store ring, ring cfg.store_rings + svc its park ring
 * (store_park); the cells of ring r are r * STORE_RING .. r * STORE_RING + STORE_RING - 1. */
static __always_inline __u32 park_ring(__u32 svc)
{
	return cfg.store_rings + svc;
}

static __always_inline struct hstore *ring_cell(__u32 ring, __u64 pos)
{
	__u32 idx = ring * STORE_RING + (__u32)(pos & (STORE_RING - 1));

	return bpf_map_lookup_elem(&store_ring, &idx);
}

/* ring_lap: the lap of ring's cell at pos (an array lookup, inlined by the verifier). */
static __always_inline struct store_lap *ring_lap(__u32 ring, __u64 pos)
{
	__u32 idx = ring * STORE_RING + (__u32)(pos & (STORE_RING - 1));

	return bpf_map_lookup_elem(&store_laps, &idx);
}

static __always_inline __u64 lap_word(__u64 pos, __u64 state)
{
	return pos / STORE_RING << LAP_STATE_BITS | state;
}

static __always_inline __u64 lap_empty(__u64 pos)
{
	return lap_word(pos, LAP_EMPTY);
}

/* lap_state: the state of a lap word read for pos, LAP_EMPTY when it is not pos's (released,
 * or not yet published). */
static __always_inline __u32 lap_state(__u64 w, __u64 pos)
{
	if (w >> LAP_STATE_BITS != pos / STORE_RING)
		return LAP_EMPTY;
	return w & LAP_STATE_MASK;
}

/* ring_claim returns ring's tail cell, claimed for the caller at *pos, or NULL when the ring
 * is full (or other CPUs kept claiming). The caller must ring_publish it. Only the lap is
 * read before the claim; the cell is looked up once, after it (store_ring and store_laps
 * have the same size, so the cell of a lap that exists exists: Hedger.load sizes both). */
static __always_inline struct hstore *ring_claim(__u32 ring, __u64 *pos)
{
	struct store_pos *sp = bpf_map_lookup_elem(&store_heads, &ring);
	struct store_lap *lp;
	__u64 t, lap;

	if (!sp)
		return NULL;
	for (int i = 0; i < 4; i++) {
		t = READ_ONCE(sp->tail);
		lp = ring_lap(ring, t);
		if (!lp)
			return NULL;
		lap = READ_ONCE(lp->lap);
		if (lap < lap_empty(t))
			return NULL; /* the rescuer still holds the cell a lap back: full */
		if (lap == lap_empty(t) && __sync_val_compare_and_swap(&sp->tail, t, t + 1) == t) {
			*pos = t;
			return ring_cell(ring, t);
		}
	}
	return NULL;
}

/* ring_publish publishes cell c at pos in state (enum lap_state): its owner (send time, key)
 * beside its lap word first. */
static __always_inline void ring_publish(__u32 ring, __u64 pos, const struct hstore *c, __u32 state)
{
	struct store_lap *l = ring_lap(ring, pos);

	if (!l)
		return;
	l->sent_ns = c->sent_ns;
	l->key = c->key;
	__sync_lock_test_and_set(&l->lap, lap_word(pos, state));
}

static __always_inline void ring_release(__u32 ring, __u64 pos)
{
	struct store_lap *l = ring_lap(ring, pos);

	if (l)
		__sync_lock_test_and_set(&l->lap, lap_empty(pos + STORE_RING));
}

/* store_finish zeroes what follows the bytes (the checksum reads whole 4-byte words) and the
 * UDP checksum field (computed anew for each hedge), and publishes the cell in state. A cell
 * whose copy failed is published empty and LAP_MOVED: its request, if recorded, is the
 * scoreboard's (the clone path's), and its tick drops it. */
static __always_inline void store_finish(struct hstore *c, __u32 ring, __u64 pos, __u32 len, __u32 l3, __u32 state)
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
		state = LAP_MOVED;
	}
	c->len = len;
	ring_publish(ring, pos, c, state);
}

/* store_request (splitter): stores the request m matched (r: what its scoreboard entry would
 * hold; none is written) for a hedge from a tick and asks the pacer for one. STORE_OK: stored,
 * LAP_PENDING; otherwise the reason the caller records and clones it instead. */
static __noinline int store_request(struct __sk_buff *skb, struct match *m, const struct hreq *r)
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
	c->orig_replica = r->orig_replica;
	if (len > STORE_BYTES || bpf_skb_load_bytes(skb, p->l3_off, c->data, store_len(len)) < 0)
		len = 0; /* published empty: the rescuer drops it, the ring has no hole */
	store_finish(c, m->svc, pos, len, l3, LAP_PENDING);
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

/* What a response's scan of its service's ring found (store_claim). */
enum cell_found {
	CELL_NONE = 0, /* not a pending cell's: the scoreboard decides */
	CELL_CLAIMED,  /* a pending cell's first response: claimed in the cell */
	CELL_ANSWERED, /* a cell answered already: a later response of an unhedged request */
};

/* claim_at: store_claim's look at svc's cell at pos: -1 when it is not the request's (empty,
 * another key), else enum cell_found. */
static __always_inline int claim_at(struct match *m, __u64 pos, __u64 *sent_ns)
{
	struct store_lap *l = ring_lap(m->svc, pos);
	__u64 w;
	__u32 s;

	if (!l)
		return CELL_NONE;
	w = READ_ONCE(l->lap);
	if (lap_state(w, pos) == LAP_EMPTY || !key_eq(&l->key, &m->key))
		return -1;
	*sent_ns = l->sent_ns;
	barrier();
	/* The key and time read belong to pos only if the word is still pos's: a cell is
	 * rewritten only after its release. */
	if (READ_ONCE(l->lap) != w)
		return CELL_NONE;
	s = w & LAP_STATE_MASK;
	if (s == LAP_ANSWERED)
		return CELL_ANSWERED;
	if (s != LAP_PENDING)
		return CELL_NONE;
	if (__sync_val_compare_and_swap(&l->lap, w, lap_word(pos, LAP_ANSWERED)) == w)
		return CELL_CLAIMED;
	/* Another response claimed it (a duplicate), or the tick moved it meanwhile. */
	return READ_ONCE(l->lap) == lap_word(pos, LAP_ANSWERED) ? CELL_ANSWERED : CELL_NONE;
}

/* Cells next to the head a response looks at in a plain loop; the rest of the ring, when it
 * holds more, through bpf_loop (one callback for the verifier to check, not one per cell). */
#define CLAIM_NEAR 16

struct claim_ctx {
	struct match *m;
	__u64 *sent_ns;
	__u64 from;
	int found;
};

static long claim_one(__u32 i, struct claim_ctx *x)
{
	int r = claim_at(x->m, x->from + i, x->sent_ns);

	if (r < 0)
		return 0;
	x->found = r;
	return 1;
}

/* store_claim (response path): looks for the response's request among its ring's filled
 * cells, head first (the usual place: a service that answers in order), through the lap words
 * and keys only. The first cell with its key decides: LAP_PENDING is claimed (-> LAP_ANSWERED;
 * *sent_ns its send time), LAP_ANSWERED is a later response, LAP_MOVED (or a word that moved
 * on meanwhile) leaves it to the scoreboard. The scan ends at the tail, at most STORE_RING
 * cells; a request that is in neither place was not stored, or is done with. */
static __always_inline int store_claim(struct match *m, __u64 *sent_ns)
{
	struct store_pos *sp = bpf_map_lookup_elem(&store_heads, &m->svc);
	struct claim_ctx x = { .m = m, .sent_ns = sent_ns };
	__u64 h, n;
	int r;

	if (!sp)
		return CELL_NONE;
	h = READ_ONCE(sp->head);
	n = READ_ONCE(sp->tail) - h;
	for (__u32 i = 0; i < CLAIM_NEAR; i++) {
		if (i >= n)
			return CELL_NONE;
		r = claim_at(m, h + i, sent_ns);
		if (r >= 0)
			return r;
	}
	if (n > STORE_RING)
		n = STORE_RING;
	x.from = h + CLAIM_NEAR;
	bpf_loop(n - CLAIM_NEAR, claim_one, &x, 0);
	return x.found;
}

/* cell_waits: the request of a cell that is not due yet may still need its hedge: pending in
 * the cell, or (LAP_MOVED) its scoreboard entry this request's, pending or hedged with more
 * to come. A cell that does not wait (answered, evicted, replaced) is popped at a tick before
 * its deadline. */
static __always_inline int cell_waits(struct hstore *c, __u32 state)
{
	struct hreq *e;

	if (state != LAP_MOVED)
		return state == LAP_PENDING;
	e = bpf_map_lookup_elem(&scoreboard, &c->key);
	return e && e->sent_ns == c->sent_ns && (e->state == REQ_PENDING || e->state == REQ_HEDGED);
}

/* store_move (rescuer): the pending request of svc's cell at pos is due: it enters the
 * scoreboard, which decides from now on (send.h), before the tick pops its cell - first its
 * entry, then the word LAP_PENDING -> LAP_MOVED, so that a response finds it in one place or
 * the other at every moment. A response that claimed it in the cell first wins: the entry
 * goes again. An entry of a newer request with the same key is left alone: the cell is marked
 * moved without one and sends nothing. 1: moved. A global function: verified once, on its own (maps.h, tick_state). */
__attribute__((noinline)) int store_move(__u32 svc, __u64 pos)
{
	__u32 idx = svc * STORE_RING + (__u32)(pos & (STORE_RING - 1));
	struct hstore *c = bpf_map_lookup_elem(&store_ring, &idx);
	struct store_lap *l = bpf_map_lookup_elem(&store_laps, &idx);
	__u64 w = lap_word(pos, LAP_PENDING);
	struct hreq r = {};

	struct hreq *e;

	if (!c || !l || READ_ONCE(l->lap) != w)
		return 0;
	e = bpf_map_lookup_elem(&scoreboard, &c->key);
	if (e && e->sent_ns > c->sent_ns) {
		/* A newer request with the same key is recorded (cloned): it keeps the key, and
		 * this cell sends nothing (stored_orphaned). */
		__sync_val_compare_and_swap(&l->lap, w, lap_word(pos, LAP_MOVED));
		return 0;
	}
	r.sent_ns = c->sent_ns;
	r.deadline_ns = c->deadline_ns;
	r.state = REQ_PENDING;
	r.orig_replica = c->orig_replica;
	r.hedge_replica = REPLICA_NONE;
	r.tried = r.orig_replica < REPLICA_MAX ? 1U << r.orig_replica : 0;
	if (bpf_map_update_elem(&scoreboard, &c->key, &r, BPF_ANY) < 0) {
		COUNT(stats_for(svc), scoreboard_errors);
		return 0;
	}
	if (__sync_val_compare_and_swap(&l->lap, w, lap_word(pos, LAP_MOVED)) != w) {
		bpf_map_delete_elem(&scoreboard, &c->key);
		return 0;
	}
	return 1;
}

/* store_copy fills cell n, claimed at pos of ring, with the request of cell c, due at
 * deadline, and publishes it in state. Returns the length copied (0: published empty). */
static __always_inline __u32 store_copy(struct hstore *n, __u32 ring, __u64 pos, const struct hstore *c,
					__u64 deadline, __u32 state)
{
	__u32 len = c->len, words;

	n->key = c->key;
	n->sent_ns = c->sent_ns;
	n->delay_ns = c->delay_ns;
	n->deadline_ns = deadline;
	n->l3_len = c->l3_len;
	n->ipv6 = c->ipv6;
	n->orig_replica = c->orig_replica;
	if (len > STORE_BYTES)
		len = 0;
	/* Whole words, the cell's data being 8-byte aligned (struct hstore). */
	words = (len + 7) / 8;
	for (__u32 i = 0; i < STORE_BYTES / 8; i++) {
		if (i >= words)
			break;
		((__u64 *)n->data)[i] = ((const __u64 *)c->data)[i];
	}
	store_finish(n, ring, pos, len, c->l3_len, state);
	return n->len;
}

/* store_requeue queues the request of cell c (popped, still held) again for a further hedge,
 * due at now + its delay: a new cell at its ring's tail with c's bytes. 0, or -1 when the
 * ring is full. */
static __always_inline int store_requeue(__u32 svc, struct hstore *c, __u64 now)
{
	struct hstore *n;
	__u64 pos;

	n = ring_claim(svc, &pos);
	if (!n)
		return -1;
	/* Its request is the scoreboard's (HEDGED): the entry decides. */
	return store_copy(n, svc, pos, c, now + c->delay_ns, LAP_MOVED) ? 0 : -1;
}

/* store_park (response path): svc's store ring is deep (STORE_PARK_DEPTH) and its head, at
 * pos, still pending - a stalled request, with the answered ones piling up behind it until
 * its deadline. The request moves into the scoreboard (store_move) and its bytes into a cell
 * of the service's park ring, due at the same deadline, and the head moves on: the answered
 * cells behind it leave at once, so the ring holds the requests still waiting, not
 * rate x delay of them, and a response's search of it stays short. The park ring is a FIFO
 * of deadlines like the store ring (its requests leave the store ring's head in order, their
 * deadlines unchanged) and the tick pops it as it pops the store ring (tick.h); its cells
 * are LAP_MOVED: the scoreboard entry decides. store_park holds the store ring's tick flag
 * (store_pos.ticking), so no tick pops the head meanwhile. 1: parked; 0: left where it was
 * (a tick at the ring, the head moved on, the park ring full, or the request answered
 * meanwhile: its copy is published empty, and its tick drops it). A global function:
 * verified once, on its own. */
__attribute__((noinline)) int store_park(__u32 svc, __u64 pos)
{
	struct store_pos *sp;
	struct hstore *c, *n;
	__u32 park;
	__u64 ppos;
	int ok = 0;

	if (svc >= SVC_MAX)
		return 0;
	sp = bpf_map_lookup_elem(&store_heads, &svc);
	if (!sp || __sync_val_compare_and_swap(&sp->ticking, 0, 1) != 0)
		return 0;
	park = park_ring(svc);
	c = ring_cell(svc, pos);
	if (!c || READ_ONCE(sp->head) != pos)
		goto out;
	n = ring_claim(park, &ppos);
	if (!n)
		goto out;
	if (!store_move(svc, pos)) {
		n->key = c->key;
		n->sent_ns = c->sent_ns;
		store_finish(n, park, ppos, 0, 0, LAP_MOVED);
		goto out;
	}
	store_copy(n, park, ppos, c, c->deadline_ns, LAP_MOVED);
	if (__sync_val_compare_and_swap(&sp->head, pos, pos + 1) == pos)
		ring_release(svc, pos);
	ok = 1;
out:
	__sync_lock_test_and_set(&sp->ticking, 0);
	return ok;
}

/* Answered cells a response pops from its ring's head at most (its own and those answered
 * out of order behind it); the rest go at the next response or tick. */
#define RESPONSE_POPS_MAX 8

/* store_pop_answered (response path): pops the answered cells at the head of m's ring, so
 * that no tick is needed for them: ticks come only for requests still waiting at their
 * deadline (store_tick). Each gives its budget reservation back (stored_answered). A
 * pending head of a ring STORE_PARK_DEPTH deep is parked (store_park) and the pops go on
 * behind it. */
static __always_inline void store_pop_answered(struct match *m)
{
	struct store_pos *sp = bpf_map_lookup_elem(&store_heads, &m->svc);
	struct store_lap *l;
	__u64 h, w;

	if (!sp)
		return;
	for (int i = 0; i < RESPONSE_POPS_MAX; i++) {
		h = READ_ONCE(sp->head);
		l = ring_lap(m->svc, h);
		if (!l)
			return;
		w = READ_ONCE(l->lap);
		if (w == lap_word(h, LAP_PENDING) && READ_ONCE(sp->tail) - h >= STORE_PARK_DEPTH) {
			if (!store_park(m->svc, h))
				return;
			COUNT(m->cnt, stored_parked);
			continue;
		}
		if (w != lap_word(h, LAP_ANSWERED))
			return;
		if (__sync_val_compare_and_swap(&sp->head, h, h + 1) != h)
			return; /* a tick or another response took it */
		ring_release(m->svc, h);
		budget_release(m->cfg, m->st);
		COUNT(m->cnt, stored_answered);
	}
}

#endif /* KEDGE_HEDGE_STORE_H */
