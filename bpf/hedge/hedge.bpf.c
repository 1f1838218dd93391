// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* hedge.bpf.c - the client side of kedge's transparent UDP request hedger.
 * Entry points read as parse -> decide -> act -> count:
 *   hedge_split  (TC egress, client iface)       record the request, clone it into the delay line
 *   hedge_rescue (TC ingress, delay-line veth)   drop, recirculate, or send the hedge
 *   hedge_resp   (TC ingress, client iface)      first response wins; drop the duplicate
 *   hedge_tick   (bpf_timer, armed by hedge_arm) adaptive delay + scoreboard expiry
 * and, inside the kedge-owned delay-line namespace:
 *   dl_entry     (TC ingress, dl veth peer)      clone -> the delay device (edt: set tstamp)
 *   dl_loop      (TC ingress, delay device peer) conveyor fillers go round; clones go back
 * The contract with user space is bpf/include/hedge.h. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "parse.h"
#include "csum.h"
#include "hedge.h"

/* Scoreboard size: entries live about one hedge delay (longer for hedged requests, until
 * the second response or the TTL). 65536 covers 100k req/s at 500 ms lifetimes; LRU so a
 * full map evicts the oldest entry instead of failing, and an evicted request is simply not
 * hedged (its clone finds no entry and is dropped). User space may resize before load. */
#define SCOREBOARD_SIZE 65536

/* Set by user space before load. */
const volatile __u32 cfg_dl_ifindex = 0;     /* delay-line veth in the client namespace */
const volatile __u32 cfg_out_ifindex = 0;    /* client interface hedges leave through */
const volatile __u32 cfg_hedge_mark = 0x6b650000; /* skb->mark on hedges: not cloned again */
const volatile __u64 cfg_early_ns = 0;       /* clone due within this -> send (half a conveyor period) */
const volatile __u64 cfg_ttl_ns = 5000000000ULL; /* scoreboard entry lifetime */
const volatile __u64 cfg_tick_ns = 3000000000ULL; /* adaptive delay refresh and GC period */
/* Delay line (ifindexes inside the delay-line namespace). */
const volatile __u32 cfg_dl_backend = 0;     /* enum dl_backend */
const volatile __u32 cfg_dl_peer_ifindex = 0; /* peer of cfg_dl_ifindex */
const volatile __u32 cfg_dl_dev_ifindex = 0;  /* device carrying the delay qdisc */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SVC_MAX);
	__type(key, struct svc_key);
	__type(value, __u32); /* service index */
} services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SVC_MAX * (REPLICA_MAX + 1));
	__type(key, struct svc_key);
	__type(value, struct replica_ref);
} replicas SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SVC_MAX);
	__type(key, __u32);
	__type(value, struct svc_cfg);
} svc_cfgs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SVC_MAX);
	__type(key, __u32);
	__type(value, struct svc_state);
} svc_states SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SCOREBOARD_SIZE);
	__type(key, struct hreq_key);
	__type(value, struct hreq);
} scoreboard SEC(".maps");

struct khist {
	__u32 b[HIST_BUCKETS];
};

/* Latency histograms: index svc * (HIST_SLOTS + 1) + slot; slot HIST_SLOTS is the running
 * total over the window. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SVC_MAX * (HIST_SLOTS + 1));
	__type(key, __u32);
	__type(value, struct khist);
} lat_hist SEC(".maps");

/* Delay-line precision: index svc * 2 (hedge sent late by x us) and svc * 2 + 1 (early). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SVC_MAX * 2);
	__type(key, __u32);
	__type(value, struct khist);
} dl_precision SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SVC_MAX + 1);
	__type(key, __u32);
	__type(value, struct hedge_stats);
} stats SEC(".maps");

struct hedge_tick {
	struct bpf_timer timer;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct hedge_tick);
} ticker SEC(".maps");

/* Evaluates st once: a second lookup would be unchecked (older verifiers do not know an
 * array lookup with a constant in-range key is non-NULL). */
#define COUNT(st, field) do { typeof(st) __c = (st); if (__c) __c->field++; } while (0)

static __always_inline struct hedge_stats *stats_for(__u32 svc)
{
	return bpf_map_lookup_elem(&stats, &svc);
}

static __always_inline void hist_add(void *map, __u32 idx, __u64 us)
{
	struct khist *h = bpf_map_lookup_elem(map, &idx);
	__u32 b = hist_bucket(us);

	/* hist_bucket() clamps, so clang would drop this check; older verifiers (6.1) need it. */
	barrier_var(b);
	if (h && b < HIST_BUCKETS)
		__sync_fetch_and_add(&h->b[b], 1);
}

/* Records a request latency in the current slot and in the running total. */
static __always_inline void record_latency(__u32 svc, struct svc_state *st, __u64 ns)
{
	__u32 base = svc * (HIST_SLOTS + 1);
	__u32 slot = st->slot;

	if (slot >= HIST_SLOTS)
		slot = 0;
	hist_add(&lat_hist, base + slot, ns / 1000);
	hist_add(&lat_hist, base + HIST_SLOTS, ns / 1000);
	__sync_fetch_and_add(&st->window_count, 1);
}

/* A parsed UDP datagram matched to a service and request. */
struct match {
	struct pkt p;
	struct hreq_key key;
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

/* parse_udp parses the skb; returns 1 for an unfragmented UDP datagram, 0 otherwise.
 * The callers count what they pass: fragments, and malformed packets (see is_malformed). */
static __always_inline int parse_udp(struct __sk_buff *skb, struct pkt *p, int *perr)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;

	*perr = parse_pkt(data, data_end, p);
	return *perr == PARSE_OK && p->l4_proto == IPPROTO_UDP && !(p->flags & PKT_F_FRAG);
}

/* is_malformed: parse.h rejected the packet, and not for being something else than IP or a
 * fragment (those are not malformed). Nothing is known of its ports, so no service. */
static __always_inline int is_malformed(int perr, const struct pkt *p)
{
	return perr != PARSE_OK && perr != PARSE_ERR_L3_PROTO && perr != PARSE_ERR_FRAGMENT &&
	       !(p->flags & PKT_F_FRAG);
}

/* match_request: the datagram is addressed to a service; fills the scoreboard key. */
static __always_inline int match_request(struct __sk_buff *skb, struct match *m)
{
	struct svc_key k;
	__u32 *svc;
	int perr;

	if (!parse_udp(skb, &m->p, &perr)) {
		if (perr == PARSE_ERR_FRAGMENT || m->p.flags & PKT_F_FRAG) {
			addr_key(&k, &m->p.daddr, m->p.dport);
			if (bpf_map_lookup_elem(&services, &k) || perr == PARSE_ERR_FRAGMENT)
				COUNT(stats_for(SVC_MAX), fragments);
		} else if (is_malformed(perr, &m->p)) {
			COUNT(stats_for(SVC_MAX), malformed);
		}
		return 0;
	}
	addr_key(&k, &m->p.daddr, m->p.dport);
	svc = bpf_map_lookup_elem(&services, &k);
	if (!svc)
		return 0;
	m->svc = *svc;
	if (m->svc >= SVC_MAX)
		return 0;
	m->cfg = bpf_map_lookup_elem(&svc_cfgs, &m->svc);
	m->st = bpf_map_lookup_elem(&svc_states, &m->svc);
	m->cnt = stats_for(m->svc);
	if (!m->cfg || !m->st || !m->cfg->enabled)
		return 0;
	__builtin_memset(&m->key, 0, sizeof(m->key));
	if (reqid_load(skb, &m->p, &m->cfg->reqid, &m->key.id) < 0) {
		COUNT(m->cnt, short_requests);
		return 0;
	}
	m->key.caddr = m->p.saddr;
	m->key.cport = m->p.sport;
	m->key.svc = m->svc;
	return 1;
}

/* Budget (docs/hedging.md): each request deposits ratio tokens while fewer than the cap
 * (burst) are free; the splitter takes one for each clone it sends into the delay line;
 * budget_return gives it back when the clone is dropped without a hedge. The return is not
 * capped: the token was deposited before, so "hedges <= ratio * requests + burst" stays
 * exact (every hedge spends a token a request deposited or the initial bucket held). */
static __always_inline void budget_deposit(struct svc_cfg *cfg, struct svc_state *st)
{
	if (st->tokens_milli < (__s64)cfg->budget_cap_milli)
		__sync_fetch_and_add(&st->tokens_milli, cfg->budget_ratio_milli);
}

static __always_inline int budget_take(struct svc_state *st)
{
	if (__sync_fetch_and_add(&st->tokens_milli, -1000) >= 1000)
		return 1;
	__sync_fetch_and_add(&st->tokens_milli, 1000);
	return 0;
}

static __always_inline void budget_return(struct svc_state *st)
{
	__sync_fetch_and_add(&st->tokens_milli, 1000);
}

SEC("tc")
int hedge_split(struct __sk_buff *skb)
{
	struct match m;
	struct hreq r = {};
	__u64 now;
	int token;

	if (skb->mark == cfg_hedge_mark)
		return TC_ACT_UNSPEC; /* a hedge we sent: never cloned again */
	if (!match_request(skb, &m))
		return TC_ACT_UNSPEC;
	COUNT(m.cnt, requests);
	now = bpf_ktime_get_ns();
	budget_deposit(m.cfg, m.st);

	r.sent_ns = now;
	r.deadline_ns = now + m.cfg->delay_ns;
	r.state = REQ_PENDING;
	r.orig_replica = m.cfg->orig_index;
	r.hedge_replica = REPLICA_NONE;
	/* The clone takes its hedge's token now: without one it would only ride the delay line
	 * to be refused, and concurrent requests could not all count on the same token. */
	token = budget_take(m.st);
	if (!token) {
		COUNT(m.cnt, budget_exhausted);
		r.state = REQ_NOCLONE;
	}
	if (bpf_map_update_elem(&scoreboard, &m.key, &r, BPF_ANY) < 0) {
		if (token)
			budget_return(m.st);
		COUNT(m.cnt, scoreboard_errors);
		return TC_ACT_UNSPEC;
	}
	if (!token)
		return TC_ACT_UNSPEC;
	if (bpf_clone_redirect(skb, cfg_dl_ifindex, 0) < 0) {
		struct hreq *e = bpf_map_lookup_elem(&scoreboard, &m.key);

		budget_return(m.st);
		COUNT(m.cnt, clone_errors);
		if (e)
			e->state = REQ_NOCLONE;
		return TC_ACT_UNSPEC;
	}
	COUNT(m.cnt, clones);
	return TC_ACT_UNSPEC;
}

/* rewrite_addr replaces the 16-byte (IPv6) or 4-byte (IPv4) address at l3 offset 'aoff'
 * and the port at l4 offset 'poff', keeping IP and UDP checksums right whatever the skb's
 * checksum state (the helpers handle CHECKSUM_PARTIAL/COMPLETE/NONE).
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
static __always_inline struct svc_addr *replica_at(struct svc_cfg *cfg, __u32 i)
{
	barrier_var(i);
	i &= REPLICA_MAX - 1;
	return &cfg->replicas[i];
}

static __always_inline __u32 pick_replica(struct svc_cfg *cfg, struct svc_state *st, __u8 orig)
{
	__u32 n = cfg->nreplicas, i;

	if (n <= 1)
		return 0;
	if (n > REPLICA_MAX)
		n = REPLICA_MAX;
	i = st->rr++; /* racy across CPUs by design: spreading, not counting */
	if (orig >= n) /* VIP-only service address: any replica */
		return i % n;
	return (orig + 1 + i % (n - 1)) % n;
}

static __always_inline void record_precision(__u32 svc, __u64 now, __u64 deadline)
{
	if (now >= deadline)
		hist_add(&dl_precision, svc * 2, (now - deadline) / 1000);
	else
		hist_add(&dl_precision, svc * 2 + 1, (deadline - now) / 1000);
}

/* hedge_failed: the clone was due but no hedge left (the packet is dropped). The entry
 * becomes NOHEDGE, so its response completes it, and the clone's token goes back. */
static __always_inline void hedge_failed(struct match *m, struct hreq *e)
{
	e->state = REQ_NOHEDGE;
	budget_return(m->st);
}

SEC("tc")
int hedge_rescue(struct __sk_buff *skb)
{
	struct match m;
	struct hreq *e;
	struct svc_addr to, from;
	__u32 idx;
	__u64 now;
	long ret;

	if (!match_request(skb, &m))
		return TC_ACT_SHOT; /* nothing but clones arrive here */
	e = bpf_map_lookup_elem(&scoreboard, &m.key);
	if (!e) {
		budget_return(m.st);
		COUNT(m.cnt, clones_orphaned);
		return TC_ACT_SHOT;
	}
	if (e->state != REQ_PENDING) {
		if (e->state == REQ_ANSWERED)
			bpf_map_delete_elem(&scoreboard, &m.key);
		budget_return(m.st);
		COUNT(m.cnt, clones_answered);
		return TC_ACT_SHOT;
	}
	now = bpf_ktime_get_ns();
	if (now + cfg_early_ns < e->deadline_ns) {
		ret = bpf_redirect(cfg_dl_ifindex, 0);
		if (ret != TC_ACT_REDIRECT) {
			hedge_failed(&m, e);
			COUNT(m.cnt, redirect_errors);
			return TC_ACT_SHOT;
		}
		COUNT(m.cnt, recirculations);
		return ret;
	}
	/* Due and unanswered: the token this clone took at the splitter pays for the hedge. */
	idx = pick_replica(m.cfg, m.st, e->orig_replica);
	to = *replica_at(m.cfg, idx);
	__builtin_memset(&from, 0, sizeof(from));
	from.addr = m.p.daddr;
	from.port = m.p.dport;
	if (rewrite_addr(skb, &m.p, 1, &from, &to) < 0) {
		hedge_failed(&m, e);
		COUNT(m.cnt, hedge_rewrite_errors);
		return TC_ACT_SHOT;
	}
	skb->mark = cfg_hedge_mark;
	ret = bpf_redirect_neigh(cfg_out_ifindex, NULL, 0, 0);
	if (ret != TC_ACT_REDIRECT) {
		hedge_failed(&m, e);
		COUNT(m.cnt, redirect_errors);
		return TC_ACT_SHOT;
	}
	e->state = REQ_HEDGED;
	e->hedged_ns = now;
	e->hedge_replica = idx;
	record_precision(m.svc, now, e->deadline_ns);
	COUNT(m.cnt, hedges_sent);
	return ret;
}

/* match_response: the datagram comes from a service address or one of its replicas.
 * What it cannot match passes untouched; malformed packets count in the global slot,
 * responses too short for the request id in their service's. */
static __always_inline int match_response(struct __sk_buff *skb, struct match *m, struct replica_ref *ref)
{
	struct svc_key k;
	struct replica_ref *r;
	int perr;

	if (!parse_udp(skb, &m->p, &perr)) {
		if (is_malformed(perr, &m->p))
			COUNT(stats_for(SVC_MAX), malformed_responses);
		return 0;
	}
	addr_key(&k, &m->p.saddr, m->p.sport);
	r = bpf_map_lookup_elem(&replicas, &k);
	if (!r)
		return 0;
	*ref = *r;
	m->svc = ref->svc;
	if (m->svc >= SVC_MAX)
		return 0;
	m->cfg = bpf_map_lookup_elem(&svc_cfgs, &m->svc);
	m->st = bpf_map_lookup_elem(&svc_states, &m->svc);
	m->cnt = stats_for(m->svc);
	if (!m->cfg || !m->st || !m->cfg->enabled)
		return 0;
	__builtin_memset(&m->key, 0, sizeof(m->key));
	if (reqid_load(skb, &m->p, &m->cfg->reqid, &m->key.id) < 0) {
		COUNT(m->cnt, short_responses);
		return 0;
	}
	m->key.caddr = m->p.daddr;
	m->key.cport = m->p.dport;
	m->key.svc = m->svc;
	return 1;
}

SEC("tc")
int hedge_resp(struct __sk_buff *skb)
{
	struct match m;
	struct replica_ref ref;
	struct hreq *e;
	__u64 now;
	__u32 orig;

	if (!match_response(skb, &m, &ref))
		return TC_ACT_UNSPEC;
	e = bpf_map_lookup_elem(&scoreboard, &m.key);
	if (!e)
		return TC_ACT_UNSPEC; /* not tracked (expired, evicted, or not a hedged service's request) */

	switch (e->state) {
	case REQ_ANSWERED_HEDGED:
		bpf_map_delete_elem(&scoreboard, &m.key);
		COUNT(m.cnt, duplicates_dropped);
		return TC_ACT_SHOT;
	case REQ_ANSWERED:
		return TC_ACT_UNSPEC; /* the application's own duplicate: not ours to judge */
	}

	now = bpf_ktime_get_ns();
	record_latency(m.svc, m.st, now - e->sent_ns);
	COUNT(m.cnt, responses);
	if (e->state == REQ_HEDGED) {
		/* With a single address the responses cannot be told apart; a response after the
		 * hedge left counts as the hedge's. */
		if (ref.index == e->hedge_replica)
			COUNT(m.cnt, hedges_won);
		e->state = REQ_ANSWERED_HEDGED;
	} else if (e->state == REQ_PENDING) {
		e->state = REQ_ANSWERED; /* the clone deletes the entry when it comes out */
	} else {
		bpf_map_delete_elem(&scoreboard, &m.key); /* NOCLONE / NOHEDGE: nothing follows */
		return TC_ACT_UNSPEC;
	}

	/* A response from another replica than the one the client addressed is rewritten so
	 * the client (a connected socket included) accepts it. */
	orig = m.cfg->orig_index;
	if (ref.is_svc || orig >= REPLICA_MAX || ref.index >= REPLICA_MAX)
		return TC_ACT_UNSPEC;
	{
		struct svc_addr from = *replica_at(m.cfg, ref.index);
		struct svc_addr to = *replica_at(m.cfg, orig);

		if (rewrite_addr(skb, &m.p, 0, &from, &to) < 0) {
			COUNT(m.cnt, response_rewrite_errors);
			return TC_ACT_UNSPEC;
		}
		COUNT(m.cnt, responses_rewritten);
	}
	return TC_ACT_UNSPEC;
}

/* ---- periodic work: adaptive delay and scoreboard expiry (bpf_timer, softirq) ---- */

struct gc_ctx {
	__u64 now;
};

/* Counts through the stats map, not the context: a counter in the context would make every
 * iteration a distinct verifier state. */
static long gc_one(void *map, struct hreq_key *key, struct hreq *r, struct gc_ctx *ctx)
{
	if (ctx->now - r->sent_ns > cfg_ttl_ns) {
		bpf_map_delete_elem(map, key);
		COUNT(stats_for(SVC_MAX), gc_expired);
	}
	return 0;
}

/* Bucket index -> upper edge in microseconds (the inverse of hist_bucket). */
static __always_inline __u64 bucket_upper_us(__u32 b)
{
	__u32 e, sub;

	if (b < 2 * HIST_SUB)
		return b + 1;
	e = b / HIST_SUB + HIST_SUB_BITS - 1;
	sub = b % HIST_SUB;
	return (__u64)(HIST_SUB + sub + 1) << (e - HIST_SUB_BITS);
}

/* Plain bounded loops, not bpf_loop callbacks: a callback that accumulates into its
 * context never converges in the verifier (each sum is a new state). */
static __always_inline __u64 hist_count(struct khist *h)
{
	__u64 n = 0;

	for (__u32 i = 0; i < HIST_BUCKETS; i++)
		n += h->b[i];
	return n;
}

static __always_inline __u32 hist_quantile_bucket(struct khist *h, __u64 target)
{
	__u64 seen = 0;

	for (__u32 i = 0; i < HIST_BUCKETS; i++) {
		seen += h->b[i];
		if (seen >= target)
			return i;
	}
	return HIST_BUCKETS - 1;
}

/* Moves the expiring slot's counts out of the running total (xchg: no lost increments). */
static __always_inline void hist_drain(struct khist *old, struct khist *total)
{
	for (__u32 i = 0; i < HIST_BUCKETS; i++) {
		__u32 n = __sync_lock_test_and_set(&old->b[i], 0);

		if (n)
			__sync_fetch_and_sub(&total->b[i], n);
	}
}

static long tick_service(__u32 svc, void *unused)
{
	struct svc_cfg *cfg;
	struct svc_state *st;
	struct khist *total, *old;
	__u32 base, next, idx;
	__u64 count, d;

	if (svc >= SVC_MAX)
		return 1;
	cfg = bpf_map_lookup_elem(&svc_cfgs, &svc);
	st = bpf_map_lookup_elem(&svc_states, &svc);
	if (!cfg || !st || !cfg->enabled || cfg->mode != DELAY_QUANTILE)
		return 0;
	base = svc * (HIST_SLOTS + 1);
	idx = base + HIST_SLOTS;
	total = bpf_map_lookup_elem(&lat_hist, &idx);
	if (!total)
		return 0;

	/* The quantile over the window, clamped; too few samples keep the current delay. */
	count = hist_count(total);
	st->window_count = count;
	if (count > 0 && count >= cfg->min_samples) {
		d = bucket_upper_us(hist_quantile_bucket(total, (count * cfg->quantile_pm + 999) / 1000)) * 1000;
		if (d < cfg->min_ns)
			d = cfg->min_ns;
		if (d > cfg->max_ns)
			d = cfg->max_ns;
		cfg->delay_ns = d;
		st->last_delay_ns = d;
	}

	/* Rotate: the oldest slot leaves the window. */
	next = st->slot + 1;
	if (next >= HIST_SLOTS)
		next = 0;
	idx = base + next;
	old = bpf_map_lookup_elem(&lat_hist, &idx);
	if (old)
		hist_drain(old, total);
	st->slot = next;
	return 0;
}

static int on_tick(void *map, __u32 *key, struct hedge_tick *t)
{
	struct gc_ctx g = { .now = bpf_ktime_get_ns() };

	bpf_loop(SVC_MAX, tick_service, NULL, 0);
	bpf_for_each_map_elem(&scoreboard, gc_one, &g, 0);
	bpf_timer_start(&t->timer, cfg_tick_ns, 0);
	return 0;
}

/* hedge_arm starts the periodic timer. User space runs it once through BPF_PROG_TEST_RUN
 * (any 64-byte buffer); it returns 0 on success or the failing helper's error. */
SEC("tc")
int hedge_arm(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct hedge_tick *t = bpf_map_lookup_elem(&ticker, &zero);
	long err;

	if (!t)
		return 1;
	err = bpf_timer_init(&t->timer, &ticker, 1 /* CLOCK_MONOTONIC */);
	if (err && err != -16 /* -EBUSY: already initialised */)
		return (int)-err;
	err = bpf_timer_set_callback(&t->timer, on_tick);
	if (err)
		return (int)-err;
	return (int)-bpf_timer_start(&t->timer, cfg_tick_ns, 0);
}

/* ---- delay line (runs in the kedge-owned delay-line namespace) ---- */

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct dl_stats);
} dl_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct dl_ctl);
} dl_control SEC(".maps");

static __always_inline struct dl_stats *dl_stats_get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&dl_counters, &zero);
}

/* edt: the clone is released by fq at its deadline (skb->tstamp, CLOCK_MONOTONIC). */
static __always_inline void edt_stamp(struct __sk_buff *skb, struct dl_stats *ds)
{
	struct match m;
	struct hreq *e;

	if (!match_request(skb, &m) || !(e = bpf_map_lookup_elem(&scoreboard, &m.key))) {
		COUNT(ds, edt_no_entry);
		return;
	}
	bpf_skb_set_tstamp(skb, e->deadline_ns, BPF_SKB_TSTAMP_DELIVERY_MONO);
	COUNT(ds, edt_set);
}

SEC("tc")
int dl_entry(struct __sk_buff *skb)
{
	struct dl_stats *ds = dl_stats_get();
	long ret;

	COUNT(ds, entered);
	if (cfg_dl_backend == DL_EDT)
		edt_stamp(skb, ds);
	ret = bpf_redirect(cfg_dl_dev_ifindex, 0);
	if (ret != TC_ACT_REDIRECT)
		COUNT(ds, redirect_errors);
	return ret;
}

SEC("tc")
int dl_loop(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct dl_stats *ds = dl_stats_get();
	struct ethhdr *eth = data;
	struct filler *f = (void *)(eth + 1);
	struct dl_ctl *ctl;
	__u32 zero = 0;
	__u64 now, period;

	if ((void *)(f + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_KEDGE_FILLER) ||
	    f->magic != FILLER_MAGIC) {
		/* A clone that has served its time goes back towards the rescuer. */
		COUNT(ds, exited);
		return bpf_redirect(cfg_dl_peer_ifindex, 0);
	}
	ctl = bpf_map_lookup_elem(&dl_control, &zero);
	if (ctl && ctl->stop) {
		COUNT(ds, fillers_dropped);
		return TC_ACT_SHOT;
	}
	if (ctl && ctl->fillers_to_drop > 0) {
		if (__sync_fetch_and_add(&ctl->fillers_to_drop, -1) > 0) {
			COUNT(ds, fillers_dropped);
			return TC_ACT_SHOT;
		}
		__sync_fetch_and_add(&ctl->fillers_to_drop, 1); /* lost a race: undo */
	}
	now = bpf_ktime_get_ns();
	if (ds) {
		period = now - f->stamp_ns;
		if (f->stamp_ns && period < 10000000000ULL) {
			ds->period_sum_ns += period;
			ds->period_count++;
			if (!ds->period_min_ns || period < ds->period_min_ns)
				ds->period_min_ns = period;
			if (period > ds->period_max_ns)
				ds->period_max_ns = period;
		}
		ds->filler_passes++;
	}
	f->stamp_ns = now;
	return bpf_redirect(cfg_dl_dev_ifindex, 0);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
