/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* store.h - the stored path: store, don't clone (docs/hedging.md, Data path).
 *
 * The splitter copies a request's IP header, UDP header and payload (payload <=
 * svc_cfg.store_limit) into a cell of its service's store ring and asks the pacer for a tick
 * at the ring head's deadline; the request itself leaves untouched and nothing is cloned.
 * At a tick the rescuer pops every due cell of every service, skips what was answered or
 * evicted meanwhile, rebuilds the tick's skb into the hedge (headers, payload, a full UDP
 * checksum) and sends it to the next replica with bpf_redirect_neigh (the neighbour table
 * fills in the L2 addresses, as on the clone path) as the tick's verdict. When several are
 * due, each hedge but the last is cloned back into the pacer veth's ingress (marked as a
 * hedge), where the rescuer sends it on with bpf_redirect_neigh: a clone has no neighbour
 * resolution of its own, and bpf_fib_lookup answers only where forwarding is enabled, which
 * a client's namespace need not have. A request that may have
 * more hedges (svc_cfg.max_hedges) is queued again at now + its delay. Then the rescuer asks
 * for a tick at the earliest deadline still waiting; with nothing waiting nothing ticks.
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
 * The ring (one per service, STORE_RING cells): a multi-producer queue with per-cell laps.
 * Position pos maps to cell pos % STORE_RING; the cell is empty for pos while lap ==
 * 2 * (pos / STORE_RING) and filled when lap is one more. A splitter claims the tail by
 * compare-and-exchange when its cell is empty (else the ring is full), fills it and publishes
 * it (lap + 1, an atomic exchange: the cell's bytes are visible before). The rescuer claims
 * the head the same way when its cell is filled and due, uses it in place and releases it
 * (lap + 2: empty for the position one lap on). No cell is ever skipped: a splitter that
 * claimed a cell publishes it even when copying failed (len 0: the rescuer drops it). */
#ifndef KEDGE_HEDGE_STORE_H
#define KEDGE_HEDGE_STORE_H

#include "maps.h"
#include "timer.h"
#include "budget.h"

enum store_result {
	STORE_OK = 0,
	STORE_TOO_LARGE,
	STORE_FULL,
	STORE_UNSUPPORTED,
};

/* Far-overdue cutoff: a stored request is not hedged later than deadline + max(its delay,
 * four pacer passes, STORE_OVERDUE_MIN_NS). So late, the pacer was behind (a lost tick
 * re-armed by the watchdog, a CPU that did not run softirqs): a burst of stale hedges then
 * adds load when the service can least take it, for clients that may have given up. Below
 * the floor a hedge still rescues a stalled request, whose client is still waiting. */
#define STORE_OVERDUE_MIN_NS 50000000ULL

/* far_overdue: a hedge due at deadline_ns after a delay of delay_ns is not sent at now (the
 * cutoff above; the clone path's rescuer applies it too, request.h). */
static __always_inline int far_overdue(__u64 deadline_ns, __u64 delay_ns, __u64 now)
{
	__u64 cutoff = delay_ns;

	if (cutoff < 8 * pacer_cfg.early_ns) /* early_ns is half a pass */
		cutoff = 8 * pacer_cfg.early_ns;
	if (cutoff < STORE_OVERDUE_MIN_NS)
		cutoff = STORE_OVERDUE_MIN_NS;
	return now > deadline_ns && now - deadline_ns > cutoff;
}

/* Cells one tick pops at most (hedges sent: TICK_HEDGES_MAX of them), besides a look at each
 * service's head; more are left to a next tick asked for at once (tick_more). */
#define TICK_POPS_MAX 256

/* The hedge's Ethernet header (no VLAN: requests with an in-band tag are cloned). */
#define STORE_ETH_HLEN 14

#ifndef READ_ONCE
#define READ_ONCE(x) (*(volatile typeof(x) *)&(x))
#endif

static __always_inline struct hstore *ring_cell(__u32 svc, __u64 pos)
{
	__u32 idx = svc * STORE_RING + (__u32)(pos & (STORE_RING - 1));

	return bpf_map_lookup_elem(&store_ring, &idx);
}

static __always_inline __u64 lap_empty(__u64 pos)
{
	return pos / STORE_RING * 2;
}

/* ring_claim returns svc's tail cell, claimed for the caller at *pos, or NULL when the ring
 * is full (or other CPUs kept claiming). The caller must ring_publish it. */
static __always_inline struct hstore *ring_claim(__u32 svc, __u64 *pos)
{
	struct store_pos *sp = bpf_map_lookup_elem(&store_heads, &svc);
	struct hstore *c;
	__u64 t, lap;

	if (!sp)
		return NULL;
	for (int i = 0; i < 4; i++) {
		t = READ_ONCE(sp->tail);
		c = ring_cell(svc, t);
		if (!c)
			return NULL;
		lap = READ_ONCE(c->lap);
		if (lap < lap_empty(t))
			return NULL; /* the rescuer still holds the cell a lap back: full */
		if (lap == lap_empty(t) && __sync_val_compare_and_swap(&sp->tail, t, t + 1) == t) {
			*pos = t;
			return c;
		}
	}
	return NULL;
}

static __always_inline void ring_publish(struct hstore *c, __u64 pos)
{
	__sync_lock_test_and_set(&c->lap, lap_empty(pos) + 1);
}

static __always_inline void ring_release(struct hstore *c, __u64 pos)
{
	__sync_lock_test_and_set(&c->lap, lap_empty(pos) + 2);
}

/* store_len bounds a length already checked to be 1..STORE_BYTES for the verifier (see
 * echo_len in bpf/pacer/pacer.bpf.c). */
static __always_inline __u32 store_len(__u32 len)
{
	return ((len - 1) & (STORE_BYTES - 1)) + 1;
}

/* store_finish zeroes what follows the bytes (the checksum reads whole 4-byte words) and the
 * UDP checksum field (computed anew for each hedge), and publishes the cell. */
static __always_inline void store_finish(struct hstore *c, __u64 pos, __u32 len, __u32 l3)
{
	if (len >= l3 + sizeof(struct udphdr) && len <= STORE_BYTES) {
		barrier_var(len);
		if (len <= STORE_BYTES) {
			c->data[len] = 0;
			c->data[len + 1] = 0;
			c->data[len + 2] = 0;
			c->data[len + 3] = 0;
		}
		c->data[(l3 == 40 ? 40 : 20) + offsetof(struct udphdr, check)] = 0;
		c->data[(l3 == 40 ? 40 : 20) + offsetof(struct udphdr, check) + 1] = 0;
	} else {
		len = 0;
	}
	c->len = len;
	ring_publish(c, pos);
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
	store_finish(c, pos, len, l3);
	if (!len)
		return STORE_UNSUPPORTED;
	/* Stored (and published) before the request (docs/pacer.md: ordering). */
	pacer_request(skb, r->deadline_ns);
	return STORE_OK;
}

/* key_eq compares two scoreboard keys (40 bytes, 8-byte aligned) word by word. */
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
	struct hstore *c;
	__u64 h;

	if (!sp)
		return 0;
	h = READ_ONCE(sp->head);
	c = ring_cell(m->svc, h);
	if (!c || READ_ONCE(c->lap) != lap_empty(h) + 1 || c->sent_ns != e->sent_ns || !key_eq(&c->key, &m->key))
		return 0;
	if (__sync_val_compare_and_swap(&sp->head, h, h + 1) != h)
		return 0; /* a tick took it */
	ring_release(c, h);
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

/* ---- the rescuer's side: a pacer tick ---- */

/* What one tick's loop works with: the skb and the time on the stack, the state it changes
 * in a per-CPU map value (tick_state, maps.h). On the stack, older verifiers (6.1) take the
 * values the callback's one simulated pass leaves there for constants and hard-wire the
 * branches that test them (the flush of a held hedge was dropped as dead code); a map
 * value's contents are unknown to them. Ticks run in softirq and do not nest on a CPU. */
struct tick_ctx {
	struct __sk_buff *skb;
	struct tick_state *st;
	__u64 now;
};

struct ph4 {
	__be32 saddr;
	__be32 daddr;
	__u8 zero;
	__u8 proto;
	__be16 len;
	struct udphdr udp;
};

struct ph6 {
	struct in6_addr saddr;
	struct in6_addr daddr;
	__be32 len;
	__be32 nexthdr;
	struct udphdr udp;
};

/* payload_sum: the one's-complement sum of a cell's UDP payload (zero-padded to whole words),
 * in chunks of 512 bytes, bpf_csum_diff's limit. Negative on error. */
static __always_inline __s64 payload_sum(struct hstore *c, __u32 l3)
{
	__u32 off = l3 + sizeof(struct udphdr), end = (c->len + 3) & ~3U, o, n;
	__s64 sum = 0;

	for (int i = 0; i < 4; i++) {
		o = off + i * 512;
		if (o >= end)
			break;
		n = end - o;
		if (n > 512)
			n = 512;
		barrier_var(o);
		barrier_var(n);
		/* o <= 48 + 3 * 512 and n <= 512: inside data[STORE_BYTES + 64]. */
		if (o > 48 + 3 * 512 || n > 512 || n < 4)
			return -1;
		sum = bpf_csum_diff(NULL, 0, (__be32 *)(c->data + o), n, (__wsum)sum);
		if (sum < 0)
			return sum;
	}
	return sum;
}

/* l4_check folds a sum into a UDP checksum; a computed 0 is sent as 0xffff (RFC 768, 8200). */
static __always_inline __sum16 l4_check(__s64 sum)
{
	return udp_csum_mangled((__sum16)~csum_fold32((__u32)sum));
}

/* hedge_headers writes c's IP and UDP headers to destination to, with the IPv4 header
 * checksum and a full UDP checksum (the stored bytes' checksum may be partial: a local
 * socket's datagram at TC egress is CHECKSUM_PARTIAL). The payload is in the skb already. */
static __always_inline int hedge_headers(struct __sk_buff *skb, struct hstore *c, const struct svc_addr *to,
					 __s64 psum)
{
	__u32 plen = c->len;
	__s64 sum;

	if (!c->ipv6) {
		struct {
			struct iphdr ip;
			struct udphdr udp;
		} h;
		struct ph4 ph = { .proto = IPPROTO_UDP };

		__builtin_memcpy(&h, c->data, sizeof(h));
		h.ip.daddr = to->addr.in6_u.u6_addr32[3];
		h.ip.tot_len = bpf_htons(plen);
		h.ip.check = 0;
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&h.ip, sizeof(h.ip), 0);
		if (sum < 0)
			return -1;
		h.ip.check = (__sum16)~csum_fold32((__u32)sum);
		h.udp.dest = to->port;
		h.udp.len = bpf_htons(plen - sizeof(h.ip));
		h.udp.check = 0;
		ph.saddr = h.ip.saddr;
		ph.daddr = h.ip.daddr;
		ph.len = h.udp.len;
		ph.udp = h.udp;
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&ph, sizeof(ph), (__wsum)psum);
		if (sum < 0)
			return -1;
		h.udp.check = l4_check(sum);
		return bpf_skb_store_bytes(skb, STORE_ETH_HLEN, &h, sizeof(h), 0) < 0 ? -1 : 0;
	} else {
		struct {
			struct ipv6hdr ip;
			struct udphdr udp;
		} h;
		struct ph6 ph = { .nexthdr = bpf_htonl(IPPROTO_UDP) };

		__builtin_memcpy(&h, c->data, sizeof(h));
		h.ip.daddr = to->addr;
		h.ip.payload_len = bpf_htons(plen - sizeof(h.ip));
		h.udp.dest = to->port;
		h.udp.len = h.ip.payload_len;
		h.udp.check = 0;
		ph.saddr = h.ip.saddr;
		ph.daddr = h.ip.daddr;
		ph.len = bpf_htonl(plen - sizeof(h.ip));
		ph.udp = h.udp;
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&ph, sizeof(ph), (__wsum)psum);
		if (sum < 0)
			return -1;
		h.udp.check = l4_check(sum);
		return bpf_skb_store_bytes(skb, STORE_ETH_HLEN, &h, sizeof(h), 0) < 0 ? -1 : 0;
	}
}

/* hedge_build rewrites the tick's skb into the hedge of cell c to replica to: Ethernet (no
 * addresses: bpf_redirect_neigh fills them in), IP, UDP, payload. 0 or -1. */
static __always_inline int hedge_build(struct __sk_buff *skb, struct hstore *c, const struct svc_addr *to)
{
	struct ethhdr eth = {};
	__u32 len = c->len, l3 = c->ipv6 ? sizeof(struct ipv6hdr) : sizeof(struct iphdr);
	__u16 proto = c->ipv6 ? ETH_P_IPV6 : ETH_P_IP;
	__s64 psum;

	if (len < l3 + sizeof(struct udphdr) || len > STORE_BYTES)
		return -1;
	psum = payload_sum(c, l3);
	if (psum < 0)
		return -1;
	if (skb->protocol != bpf_htons(proto) && bpf_skb_change_proto(skb, bpf_htons(proto), 0) < 0)
		return -1;
	if (bpf_skb_change_tail(skb, STORE_ETH_HLEN + len, 0) < 0 ||
	    bpf_skb_store_bytes(skb, STORE_ETH_HLEN, c->data, store_len(len), 0) < 0 ||
	    hedge_headers(skb, c, to, psum) < 0)
		return -1;
	eth.h_proto = bpf_htons(proto);
	return bpf_skb_store_bytes(skb, 0, &eth, sizeof(eth), 0) < 0 ? -1 : 0;
}

/* requeue queues request c again for a further hedge at now + its delay, copying the bytes
 * from the hedge just built in the skb (its UDP checksum is zeroed again in the copy). */
static __always_inline int requeue(struct __sk_buff *skb, __u64 now, __u32 svc, struct hstore *c)
{
	struct hstore *n;
	__u32 len = c->len, l3 = c->ipv6 ? sizeof(struct ipv6hdr) : sizeof(struct iphdr);
	__u64 pos;

	n = ring_claim(svc, &pos);
	if (!n)
		return -1;
	n->key = c->key;
	n->sent_ns = c->sent_ns;
	n->delay_ns = c->delay_ns;
	n->deadline_ns = now + c->delay_ns;
	n->l3_len = l3;
	n->ipv6 = c->ipv6;
	if (len < 1 || len > STORE_BYTES || bpf_skb_load_bytes(skb, STORE_ETH_HLEN, n->data, store_len(len)) < 0)
		len = 0;
	store_finish(n, pos, len, l3);
	return len ? 0 : -1;
}

/* tried_of: the replicas a request has a copy at, for its first hedge the one addressed. */
static __always_inline __u32 tried_of(const struct hreq *e)
{
	if (e->tried)
		return e->tried;
	return e->orig_replica < REPLICA_MAX ? 1U << e->orig_replica : 0;
}

enum hedge_cell_result {
	CELL_SKIPPED = 0, /* nothing to send */
	CELL_BUILT = 1,   /* the hedge is in the skb, claimed and counted: the caller sends it */
};

/* store_hedge handles cell idx of service svc's ring, popped by the rescuer: skip it
 * (answered, evicted, overdue, refused) or rebuild skb into its hedge for the caller to send,
 * and queue it again when max_hedges allows. Returns enum hedge_cell_result. A global function: the
 * verifier checks it once, on its own, not once per state of the tick's loop. */
__attribute__((noinline)) int store_hedge(struct __sk_buff *skb, __u32 svc, __u32 idx, __u64 now)
{
	struct hstore *c = bpf_map_lookup_elem(&store_ring, &idx);
	struct svc_cfg *sc = bpf_map_lookup_elem(&svc_cfgs, &svc);
	struct svc_state *st = bpf_map_lookup_elem(&svc_states, &svc);
	struct hedge_stats *cnt = stats_for(svc);
	struct hreq *e;
	__u32 s, rep, tried, max;

	if (!c || !sc || !st || !c->len)
		return CELL_SKIPPED;
	e = bpf_map_lookup_elem(&scoreboard, &c->key);
	if (!e || e->sent_ns != c->sent_ns) {
		budget_release(sc, st);
		COUNT(cnt, stored_orphaned);
		return CELL_SKIPPED;
	}
	s = e->state;
	if (s != REQ_PENDING && s != REQ_HEDGED) {
		if (s == REQ_ANSWERED)
			bpf_map_delete_elem(&scoreboard, &c->key);
		budget_release(sc, st);
		COUNT(cnt, stored_answered);
		return CELL_SKIPPED;
	}
	if (far_overdue(c->deadline_ns, c->delay_ns, now)) {
		if (s == REQ_PENDING)
			__sync_val_compare_and_swap(&e->state, s, REQ_NOHEDGE);
		budget_release(sc, st);
		COUNT(cnt, overdue_dropped);
		return CELL_SKIPPED;
	}
	/* A replica that has no copy yet (replica.h) ... */
	tried = tried_of(e);
	rep = pick_replica(sc, st, tried);
	if (rep >= REPLICA_MAX) {
		if (s == REQ_PENDING)
			__sync_val_compare_and_swap(&e->state, s, REQ_NOHEDGE);
		budget_release(sc, st);
		COUNT(cnt, no_replica);
		return CELL_SKIPPED;
	}
	/* ... and the budget pays for the hedge (bucket: the token the splitter took). */
	if (!budget_charge(sc, st, now)) {
		if (s == REQ_PENDING)
			__sync_val_compare_and_swap(&e->state, s, REQ_REFUSED);
		COUNT(cnt, budget_exhausted);
		return CELL_SKIPPED;
	}
	if (hedge_build(skb, c, replica_at(sc, rep)) < 0) {
		if (s == REQ_PENDING)
			__sync_val_compare_and_swap(&e->state, s, REQ_NOHEDGE);
		budget_refund(sc, st, now);
		COUNT(cnt, hedge_build_errors);
		return CELL_SKIPPED;
	}
	/* Claimed before it leaves: a response from now on finds HEDGED and the later one is
	 * dropped as the duplicate. A response that came first keeps its claim: nothing sent. */
	if (__sync_val_compare_and_swap(&e->state, s, REQ_HEDGED) != s) {
		budget_refund(sc, st, now);
		COUNT(cnt, stored_answered);
		return CELL_SKIPPED;
	}
	e->hedges_sent++;
	e->tried = tried | (1U << rep);
	e->hedge_replica = rep;
	e->hedged_ns = now;
	skb->mark = cfg.hedge_mark;
	record_precision(svc, now, c->deadline_ns);
	COUNT(cnt, hedges_sent);
	COUNT(cnt, tick_hedges);
	max = sc->max_hedges ? sc->max_hedges : 1;
	if (e->hedges_sent < max) {
		if (!budget_reserve(sc, st))
			COUNT(cnt, budget_exhausted);
		else if (requeue(skb, now, svc, c) < 0) {
			budget_release(sc, st);
			COUNT(cnt, requeue_full);
		} else {
			COUNT(cnt, requeued);
		}
	}
	return CELL_BUILT;
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

/* tick_one (bpf_loop callback): pops one due cell of service t->svc and handles it, or moves
 * on to the next service when its head is empty or not due. */
static long tick_one(__u32 i, struct tick_ctx *c0)
{
	struct tick_state *t = c0->st;
	struct store_pos *sp;
	struct hstore *c;
	__u32 svc;
	__u64 h;
	int r;

	if (!t)
		return 1;
	svc = t->svc;
	if (svc >= SVC_MAX)
		return 1;
	sp = bpf_map_lookup_elem(&store_heads, &svc);
	if (!sp)
		return 1;
	h = READ_ONCE(sp->head);
	c = ring_cell(svc, h);
	if (!c || READ_ONCE(c->lap) != lap_empty(h) + 1) {
		t->svc++; /* empty (or a splitter is still filling the head: it asks for a tick) */
		return 0;
	}
	if (!pacer_due(c->deadline_ns, c0->now, 0) && cell_waits(c)) {
		if (!t->next || c->deadline_ns < t->next)
			t->next = c->deadline_ns;
		t->svc++;
		return 0;
	}
	/* Due, or done with before its deadline (answered out of order, evicted): popped now,
	 * so that the next tick is asked for the first request that still waits. */
	if (t->sent >= TICK_HEDGES_MAX) {
		t->more = 1; /* this tick sent its share: the next one at once */
		return 1;
	}
	if (__sync_val_compare_and_swap(&sp->head, h, h + 1) != h)
		return 0; /* another tick took it: look again */
	if (t->held) {
		hedge_flush(c0->skb);
		t->held = 0;
	}
	r = store_hedge(c0->skb, svc, svc * STORE_RING + (__u32)(h & (STORE_RING - 1)), c0->now);
	ring_release(c, h);
	if (r == CELL_BUILT) {
		t->held = 1;
		t->sent++;
	}
	return 0;
}

/* store_tick (rescuer, a pacer tick): sends every due stored request's hedge and asks for
 * the next tick. Returns the TC verdict for the tick's skb. */
static __always_inline int store_tick(struct __sk_buff *skb)
{
	struct tick_ctx c = { .skb = skb };
	struct tick_state *t;
	__u32 zero = 0;
	long ret;

	COUNT(stats_global(), pacer_ticks);
	t = bpf_map_lookup_elem(&tick_state, &zero);
	if (!t)
		return TC_ACT_SHOT;
	__builtin_memset(t, 0, sizeof(*t));
	c.st = t;
	c.now = bpf_ktime_get_ns();
	bpf_loop(SVC_MAX + TICK_POPS_MAX, tick_one, &c, 0);
	if (t->svc < SVC_MAX)
		t->more = 1; /* the loop ran out, or stopped at TICK_HEDGES_MAX */
	if (t->more) {
		COUNT(stats_global(), tick_more);
		t->next = c.now;
	}
	if (t->next)
		pacer_request(skb, t->next);
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

#endif /* KEDGE_HEDGE_STORE_H */
