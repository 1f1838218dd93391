/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* flow.h - per-flow state, timestamping requests, matching replies, the QUIC spin bit,
 * aggregation.
 *
 * Concurrency: ingress and egress of one flow may run on two CPUs at once. Each packet
 * writes its own direction's bookkeeping (struct pp_dir_own, on cache lines of its own) and
 * only reads the reverse direction's shared state, except when it opens or closes a
 * direction, stores an identifier or takes a sample. Counters that must stay consistent
 * (outstanding) are atomic; the statistics (min/smoothed RTT, the rate-limit time) may lose
 * an update under such a race, which costs at most one sample or one count, as in ePPing.
 *
 * Clocks: every measured packet reads jiffies (kedge_jiffies(), a memory read); the ns clock
 * only when the packet stores an identifier, takes a sample, closes in on a rate-limit
 * interval's end, or belongs to a direction whose reverse times pure ACKs (pp_now()). */
#ifndef KEDGE_PPING_FLOW_H
#define KEDGE_PPING_FLOW_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "clock.h"
#include "counters.h"
#include "hist.h"
#include "parse.h"
#include "proto.h"
#include "pping.h"
#include "maps.h"
#include "ident.h"

static __always_inline int pp_active(const struct pp_dir_shared *d)
{
	return d->conn == PP_CONN_WAITOPEN || d->conn == PP_CONN_OPEN;
}

/* Whether two directions are the same: struct pp_tuple is five words, its padding zero. */
static __always_inline int pp_tuple_eq(const struct pp_tuple *a, const struct pp_tuple *b)
{
	const __u64 *x = (const void *)a, *y = (const void *)b;

	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3] && x[4] == y[4];
}

/* The direction cache (maps.h's pp_dc): the slot of a direction. */
static __always_inline struct pp_dc_slot *pp_dc_of(const struct pp_tuple *t)
{
	return &pp_dc[pp_hint_slot(t)];
}

/* Whether the packet is of the kind the direction cache decides: a TCP segment with data (a
 * request that is neither a SYN nor a pure ACK this host sent), without FIN or RST. */
static __always_inline int pp_dc_kind(const struct pp_pkt *pp)
{
	return pp->pid.flow.proto == IPPROTO_TCP && pp->f.pid_valid && !pp->f.pure_ack &&
	       !pp->f.event;
}

/* The segment's decision without the flow table: its TSval is the one its direction's flow
 * state already has (the full path would count ts_not_new), and the reverse direction's hint
 * slot is zero (nothing outstanding to match, not waiting to open: match_none, or no echo).
 * Counts it as the full path would and keeps its counts in the slot. Returns 1 when the
 * packet ends here. */
static __always_inline int pp_dc_hit(const struct pp_pkt *pp, struct pp_counters *cnt)
{
	struct pp_dc_slot *s;

	if (!pp_dc_kind(pp) || pp_hint[pp_hint_slot(&pp->reply.flow)])
		return 0;
	s = pp_dc_of(&pp->pid.flow);
	if (s->last_id != (__u32)pp->pid.id || (__u32)pp->jiff - s->filled >= PP_DC_TICKS ||
	    !pp_tuple_eq(&s->dir, &pp->pid.flow))
		return 0;
	s->pkts++;
	s->bytes += pp->payload_len;
	s->seen = pp->jiff;
	COUNT(cnt, ts_not_new);
	if (pp->f.reply_valid)
		COUNT(cnt, match_none);
	return 1;
}

/* The two cheapest packets, decided on their headers alone, before the packet is copied into
 * the scratch space, identified and hashed as a tuple: a few loads, a hint slot, a cache slot
 * and the program's first lines of code, which matters most where such packets are rare (the
 * ACKs of a forwarded bulk flow, about one per 20 data segments, find little of the program
 * in cache). Both are TCP segments of the fast path's shape (pp_fast_tcp()) without SYN, FIN
 * or RST whose reverse direction's hint slot is zero:
 * - a pure ACK (no data) that is not a request of its own (a pure ACK this host sends while
 *   host_acks times them is): pp_fast_tcp() and pp_handle()'s hint test would count it
 *   match_none and stop;
 * - a segment with data whose TSval its direction's cache slot holds: pp_dc_hit().
 * Returns 1 when the packet ends here, counted. Off with aggregation (every packet is
 * counted per subnet; pp_dc_hit() still runs after the parse), with the fast path off, and
 * when TCP is not tracked. */
static __always_inline int pp_fast_segment(void *data, void *end, int host_ack,
					   struct pp_counters *cnt)
{
	struct pp_dc_slot *s;
	struct tcphdr *tcph;
	struct pp_tuple t;
	__u32 l3len, s3, d3, x2, doff, tsval;
	__u64 jiff;
	void *ip;
	int v6;

	if (pp_cfg.no_fast_path || pp_cfg.aggregate || !pp_cfg.track_tcp)
		return 0;
	tcph = pp_fast_hdrs(data, end, &ip, &v6, &l3len, ~0U);
	if (!tcph || tcph->syn || tcph->fin || tcph->rst)
		return 0;
	if (!v6) {
		struct iphdr *iph = ip;

		s3 = iph->saddr;
		d3 = iph->daddr;
		x2 = 0; /* both v4-mapped */
	} else {
		struct ipv6hdr *ip6h = ip;

		s3 = ip6h->saddr.in6_u.u6_addr32[3];
		d3 = ip6h->daddr.in6_u.u6_addr32[3];
		x2 = ip6h->saddr.in6_u.u6_addr32[2] ^ ip6h->daddr.in6_u.u6_addr32[2];
	}
	/* The reverse direction (pp_hint_slot(&pp->reply.flow)): nothing outstanding there,
	 * nothing waiting to be opened by this packet. */
	if (pp_hint[pp_hint_hash(d3, s3, x2, tcph->dest, tcph->source, IPPROTO_TCP)])
		return 0;
	doff = tcph->doff * 4;
	if (l3len == doff) {
		if (!tcph->ack || host_ack)
			return 0;
		COUNT(cnt, match_none);
		return 1;
	}
	/* Data: the packet's own direction's slot, cheapest tests first. */
	tsval = bpf_ntohl(*(__be32 *)((__u8 *)(tcph + 1) + 4));
	jiff = kedge_jiffies();
	s = &pp_dc[pp_hint_hash(s3, d3, x2, tcph->source, tcph->dest, IPPROTO_TCP)];
	if (s->last_id != tsval || (__u32)jiff - s->filled >= PP_DC_TICKS)
		return 0;
	if (!v6) {
		struct iphdr *iph = ip;

		ipv4_mapped(&t.saddr, iph->saddr);
		ipv4_mapped(&t.daddr, iph->daddr);
		t.ipv = 4;
	} else {
		struct ipv6hdr *ip6h = ip;

		t.saddr = ip6h->saddr;
		t.daddr = ip6h->daddr;
		t.ipv = 6;
	}
	t.sport = tcph->source;
	t.dport = tcph->dest;
	t.proto = IPPROTO_TCP;
	t.id_type = PP_ID_TCP_TS;
	t._pad = 0;
	if (!pp_tuple_eq(&s->dir, &t))
		return 0;
	s->pkts++;
	s->bytes += l3len - doff;
	s->seen = jiff;
	COUNT(cnt, ts_not_new);
	if (tcph->ack)
		COUNT(cnt, match_none);
	return 1;
}

/* Adds the counts a direction's slot holds for it to *pkts and *bytes. */
static __always_inline void pp_dc_pending(const struct pp_tuple *t, __u64 *pkts, __u64 *bytes)
{
	struct pp_dc_slot *s = pp_dc_of(t);

	if (s->pkts && pp_tuple_eq(&s->dir, t)) {
		*pkts += s->pkts;
		*bytes += s->bytes;
	}
}

/* The full jiffies of the slot's last segment (it keeps their low 32 bits); now: the current
 * ones. */
static __always_inline __u64 pp_dc_seen_at(const struct pp_dc_slot *s, __u64 now)
{
	return now - (__u32)((__u32)now - s->seen);
}

/* A direction's last-seen time in jiffies (now: the current ones): its flow state's, or the
 * last segment its slot counted if that came later. */
static __always_inline __u64 pp_dc_seen(const struct pp_tuple *t, __u64 last_seen, __u64 now)
{
	struct pp_dc_slot *s = pp_dc_of(t);
	__u64 seen;

	if (!s->pkts || !pp_tuple_eq(&s->dir, t))
		return last_seen;
	seen = pp_dc_seen_at(s, now);
	return seen > last_seen ? seen : last_seen;
}

/* Empties a direction's slot, its counts going with it (its flow is being deleted). */
static __always_inline void pp_dc_drop(const struct pp_tuple *t)
{
	struct pp_dc_slot *s = pp_dc_of(t);

	if (pp_tuple_eq(&s->dir, t)) {
		s->dir.proto = 0;
		s->pkts = 0;
		s->bytes = 0;
	}
}

/* Folds the counts of the direction a slot holds into its flow state, before the slot takes
 * another direction. */
static __always_inline void pp_dc_evict(const struct pp_dc_slot *s, __u64 now)
{
	struct pp_flow_state *fs;
	struct pp_dir_own *o;
	struct pp_tuple key;
	__u64 seen;
	int first;

	if (!s->pkts || !s->dir.proto)
		return;
	first = pp_src_sorts_first(&s->dir);
	if (first)
		key = s->dir;
	else
		pp_reverse(&key, &s->dir);
	fs = bpf_map_lookup_elem(&flows, &key);
	if (!fs)
		return;
	o = first ? &fs->own0 : &fs->own1;
	o->pkts += s->pkts;
	o->bytes += s->bytes;
	seen = pp_dc_seen_at(s, now);
	if (seen > o->last_seen)
		o->last_seen = seen;
}

/* After the full path of a TCP packet: folds the counts its direction's slot holds into the
 * flow state, and (re)fills the slot when the direction qualifies (a data segment of a
 * direction that is active, not local, not timed in ns) or empties it when it does not. */
static __always_inline void pp_dc_fill(const struct pp_dir_shared *fwd, struct pp_dir_own *fo,
				       const struct pp_pkt *pp)
{
	struct pp_dc_slot *s;
	int mine;

	if (pp->pid.flow.proto != IPPROTO_TCP)
		return;
	s = pp_dc_of(&pp->pid.flow);
	mine = pp_tuple_eq(&s->dir, &pp->pid.flow);
	if (mine && s->pkts) {
		fo->pkts += s->pkts;
		fo->bytes += s->bytes;
		s->pkts = 0;
		s->bytes = 0;
	}
	if (!pp_dc_kind(pp) || !pp_active(fwd) || fwd->local || fwd->ns_seen) {
		if (mine)
			s->dir.proto = 0;
		return;
	}
	if (!mine) {
		pp_dc_evict(s, pp->jiff);
		/* Emptied first, filled, then named: a segment on another CPU never matches
		 * the new direction with the old one's TSval. */
		s->dir.proto = 0;
		s->pkts = 0;
		s->bytes = 0;
	}
	s->last_id = fo->last_id;
	s->filled = pp->jiff;
	s->seen = pp->jiff;
	if (!mine) {
		barrier();
		s->dir = pp->pid.flow;
	}
}

/* Whether the packet's destination is this host (ePPing's local-flow filter): a FIB lookup
 * from the ingress interface that ends in "not forwarded". Done once per flow direction.
 * ctx is the program's (TC or XDP): bpf_fib_lookup takes either. */
static __always_inline int pp_dst_is_local(void *ctx, const struct pp_pkt *pp)
{
	const struct pkt *p = &pp->p;
	struct bpf_fib_lookup fib = {};
	long ret;

	fib.ifindex = pp->ifindex;
	fib.l4_protocol = p->l4_proto;
	fib.tot_len = p->payload_len;
	if (p->l3_proto == ETH_P_IP) {
		fib.family = AF_INET;
		fib.tos = p->tos;
		fib.ipv4_src = p->saddr.in6_u.u6_addr32[3];
		fib.ipv4_dst = p->daddr.in6_u.u6_addr32[3];
	} else {
		fib.family = AF_INET6;
		__builtin_memcpy(fib.ipv6_src, &p->saddr, sizeof(fib.ipv6_src));
		__builtin_memcpy(fib.ipv6_dst, &p->daddr, sizeof(fib.ipv6_dst));
	}
	ret = bpf_fib_lookup(ctx, &fib, sizeof(fib), 0);
	/* FWD_DISABLED: the interface does not forward, so whatever it receives is ours. */
	return ret == BPF_FIB_LKUP_RET_NOT_FWDED || ret == BPF_FIB_LKUP_RET_FWD_DISABLED;
}

#define PP_CONN_BIT(s) (1U << (s))

/* Moves a direction's conn to 'to' if it is one of the states in 'from' (PP_CONN_BIT()s),
 * under the flow's lock, and returns the state it found. Every move that changes a hint
 * slot goes through it: two CPUs making the same move at once (a direction's first reply on
 * both, its first request on both, a close beside an open) find different states, so the
 * slot changes once. Only for those moves, never per packet. */
static __always_inline __u8 pp_conn_move(struct pp_flow_state *fs, struct pp_dir_shared *d,
					 __u32 from, __u8 to)
{
	__u8 was;

	bpf_spin_lock(&fs->lock);
	was = d->conn;
	if (from & PP_CONN_BIT(was & 7))
		d->conn = to;
	bpf_spin_unlock(&fs->lock);
	return was;
}

/* A direction's first request: it waits to be opened by a reply. */
static __always_inline void pp_dir_open(struct pp_flow_state *fs, struct pp_dir_shared *d,
					struct pp_dir_own *o, struct pp_pkt *pp, __u8 local)
{
	if (pp_conn_move(fs, d, PP_CONN_BIT(PP_CONN_EMPTY), PP_CONN_WAITOPEN) != PP_CONN_EMPTY)
		return; /* another CPU's packet opened it */
	pp_hint_add(&pp->pid.flow, 1); /* replies must come the slow way until it opens */
	d->open_reason = pp->f.event == PP_FLOW_OPENING ? pp->f.reason : PP_REASON_FIRST_PKT;
	d->has_ts = 0;
	d->local = local;
	/* A flow seen mid-stream waits for its identifier to change (wait_edge). */
	o->last_id = pp->pid.id;
	if (pp->f.pure_ack)
		o->last_id_time = pp_now(pp);
}

/* Returns the flow's state, creating it for a packet that may start a flow. */
static __always_inline struct pp_flow_state *pp_flow_get(const struct pp_pkt *pp,
							 struct pp_counters *cnt)
{
	const struct pp_tuple *key = pp->fwd == 0 ? &pp->pid.flow : &pp->reply.flow;
	struct pp_flow_state *fs;
	long err;

	fs = bpf_map_lookup_elem(&flows, key);
	if (fs)
		return fs;
	/* Only a request opens a flow: replies and closing packets of unknown flows (started
	 * before the monitor, or already closed) would only create state nobody matches. A pure
	 * reply has nothing to match, as the fast path in pp_handle() counts it too. */
	if (!pp->f.pid_valid || pp->f.event == PP_FLOW_CLOSING) {
		if (!pp->f.pid_valid && !pp->f.event)
			COUNT(cnt, match_none);
		else
			COUNT(cnt, skip_no_flow);
		return NULL;
	}
	err = bpf_map_update_elem(&flows, key, &pp_zero_flow, BPF_NOEXIST);
	if (err == 0) {
		COUNT(cnt, flow_created);
	} else if (err != -EEXIST) {
		COUNT(cnt, flow_map_full);
		pp_warn_full(cnt, &pp->pid.flow, kedge_now(), PP_MAP_FLOWS);
		return NULL;
	}
	return bpf_map_lookup_elem(&flows, key);
}

/* Whether the rate limit keeps the direction from storing another identifier now. Most
 * packets of a busy flow are rate-limited, so the test starts with jiffies: while fewer
 * ticks have passed than the interval holds (with one to spare for the tick in progress), the
 * packet is limited without reading the ns clock. */
static __always_inline int pp_rate_limited(const struct pp_dir_shared *d, struct pp_pkt *pp)
{
	__u64 rtt = pp_cfg.use_srtt ? d->srtt : d->min_rtt;
	__u64 gap = pp_cfg.rate_limit_ns, now;

	if (pp_cfg.rtt_rate && rtt)
		gap = (pp_cfg.rtt_rate * rtt) >> PP_FIXPOINT_SHIFT;
	if (!gap)
		return 0;
	if (pp_cfg.jiffy_ns && pp->jiff >= d->last_ts_j &&
	    (pp->jiff - d->last_ts_j + 1) * pp_cfg.jiffy_ns < gap)
		return 1;
	now = pp_now(pp);
	return now < d->last_ts || now - d->last_ts < gap;
}

/* TCP timestamps only grow (modulo 2^32, RFC 7323 section 5.2): a TSval is new when it is
 * ahead of the last one by less than 2^31. Other identifiers are new when they differ. */
static __always_inline int pp_id_is_new(const struct pp_pkt *pp, const struct pp_dir_own *o)
{
	if (pp->pid.flow.proto == IPPROTO_TCP) {
		__u32 delta = (__u32)pp->pid.id - (__u32)o->last_id;

		return delta != 0 && delta < (1U << 31);
	}
	return pp->pid.id != o->last_id;
}

/* Whether the direction's requests are timed: it is open and not local (-l). Counts why not. */
static __always_inline int pp_timed(const struct pp_dir_shared *d, struct pp_counters *cnt)
{
	if (!pp_active(d)) {
		COUNT(cnt, ts_inactive);
		return 0;
	}
	if (d->local) {
		COUNT(cnt, ts_local);
		return 0;
	}
	return 1;
}

/* Remembers a TSval just stored in its direction's queue (pp_retire() reads it). With the
 * queue full it is left to the garbage collector, as every TSval was before the queue. Two
 * packets of one direction storing at once on two CPUs may both take the same entry: one
 * TSval is then not remembered (the collector expires it). */
static __always_inline void pp_queue_push(struct pp_dir_shared *d, __u32 id)
{
	__u8 head = d->q_head, tail = d->q_tail;

	if ((__u8)(tail - head) >= PP_TS_QUEUE)
		return;
	d->ts_queue[tail & (PP_TS_QUEUE - 1)] = id;
	barrier(); /* the entry before the tail that exposes it */
	d->q_tail = tail + 1;
}

/* TCP: retires the identifiers of the echo's request direction (d) that are serially older
 * than the echo. The far end echoes TS.Recent, which does not go back (RFC 7323 sections
 * 4.3 and 5.3: it is updated only by a TSval at least as new), so once an ACK echoes a
 * TSval no ACK after it echoes an older one: an older TSval still stored was acknowledged
 * together with later segments (a delayed ACK echoes the first unacknowledged segment's
 * TSval, so one carried only by segments inside such a stretch is never echoed) and would
 * otherwise stay outstanding until the collector expired it (its lifetime, at least 1 s),
 * keeping its direction's hint slot non-zero and sending every ACK of the flow the full way
 * to a pkt_ts lookup that misses. Walks the queue from its oldest entry while the entries
 * are not newer than the echo: an older one is deleted from pkt_ts (ts_retired, with the
 * outstanding count and the hint slot, only if this packet's delete removed it: a stale
 * entry, already matched or expired, is passed over), one equal to the echo is left to
 * pp_match()'s lookup. Only an ACK reordered behind a later one loses by it: its sample.
 * Ingress and egress of one flow may walk and push at once; the queue only says which keys
 * to try, and a key is deleted only when older than an echo that arrived, so a race can
 * leave a TSval to the collector but never retire one that an echo could still match. */
static __always_inline void pp_retire(struct pp_dir_shared *d, struct pp_pkt *pp,
				      struct pp_counters *cnt)
{
	__u64 echo = pp->reply.id;
	__u8 head = d->q_head, n = d->q_tail - head, i;
	__u32 id;

	for (i = 0; i < PP_TS_QUEUE; i++) {
		if (i >= n)
			break;
		id = d->ts_queue[(head + i) & (PP_TS_QUEUE - 1)];
		if ((__u32)echo - id >= (1U << 31))
			break; /* newer than the echo (serial arithmetic) */
		if (id == (__u32)echo)
			continue;
		/* pp->reply is the key with the echo: the same direction, this id. */
		pp->reply.id = id;
		if (bpf_map_delete_elem(&pkt_ts, &pp->reply) == 0) {
			if (d->outstanding)
				__sync_fetch_and_add(&d->outstanding, -1);
			pp_hint_add(&pp->reply.flow, -1);
			COUNT(cnt, ts_retired);
		}
	}
	pp->reply.id = echo;
	if (i)
		d->q_head = head + i;
}

/* Stores the packet's identifier with the current time, if the direction is measured, the
 * identifier is new and the rate limit allows it. rev is the reverse direction's shared
 * state (told to time its packets precisely once a pure ACK is stored). */
static __always_inline void pp_timestamp(struct pp_dir_shared *d, struct pp_dir_own *o,
					 struct pp_dir_shared *rev, struct pp_pkt *pp,
					 struct pp_counters *cnt)
{
	__u64 stamp, now;
	long err;

	if (!pp->f.pid_valid || !pp_timed(d, cnt))
		return;
	/* A datagram identifier sent again while outstanding is a retransmission: its reply
	 * cannot tell which copy it answers (Karn), so the sample is discarded. */
	if (pp->pid.flow.proto != IPPROTO_TCP && bpf_map_delete_elem(&pkt_ts, &pp->pid) == 0) {
		if (d->outstanding)
			__sync_fetch_and_add(&d->outstanding, -1);
		pp_hint_add(&pp->pid.flow, -1);
		COUNT(cnt, ts_retrans);
		return;
	}
	if ((d->has_ts || pp->f.wait_edge) && !pp_id_is_new(pp, o)) {
		if (pp->f.pure_ack && pp->pid.id == o->last_id)
			o->last_id_time = pp_now(pp);
		COUNT(cnt, ts_not_new);
		return;
	}
	o->last_id = pp->pid.id;
	if (pp->f.pure_ack)
		o->last_id_time = pp_now(pp);
	if (d->has_ts && pp_rate_limited(d, pp)) {
		COUNT(cnt, ts_rate_limited);
		return;
	}
	/* Count the attempt even if the map is full, so a full map does not turn every packet
	 * of a busy flow into another failed insert. */
	now = pp_now(pp);
	d->has_ts = 1;
	d->last_ts = now;
	d->last_ts_j = pp->jiff;
	stamp = (now & ~PP_TS_PURE_ACK) | (pp->f.pure_ack ? PP_TS_PURE_ACK : 0);
	err = bpf_map_update_elem(&pkt_ts, &pp->pid, &stamp, BPF_NOEXIST);
	if (err == 0) {
		__sync_fetch_and_add(&d->outstanding, 1);
		pp_hint_add(&pp->pid.flow, 1);
		/* The echo of a pure ACK is judged by when the far end last sent (pp_match). */
		if (pp->f.pure_ack && !rev->ns_seen)
			rev->ns_seen = 1;
		if (pp->pid.flow.proto == IPPROTO_TCP)
			pp_queue_push(d, pp->pid.id);
		COUNT(cnt, ts_stored);
		pp_debug("stored id %llu", pp->pid.id);
	} else if (err == -EEXIST) {
		COUNT(cnt, ts_exists);
	} else {
		COUNT(cnt, ts_map_full);
		pp_warn_full(cnt, &pp->pid.flow, now, PP_MAP_PKT_TS);
	}
}

/* Histogram bucket of an RTT in ns (layout in pping.h). */
static __always_inline __u32 pp_hist_bin(__u64 rtt)
{
	return hist_bucket(rtt, PP_HIST_SUB_BITS, PP_HIST_MIN_SHIFT, PP_HIST_BINS);
}

/* The active buffer's entry for the subnet of ip on one side of the interface. A missing
 * subnet is created when create is set (a packet the monitor measures), else, and when the
 * map is full (agg_map_full), the side's "other" entry stands in: unmeasurable traffic, a
 * spoofed-source flood for instance, cannot fill the map with subnets of its own (ePPing's
 * rule). */
static __always_inline struct pp_agg_stats *pp_agg_get(const struct in6_addr *ip, __u8 ipv,
							__u8 side, int create,
							struct pp_counters *cnt)
{
	struct pp_agg_stats *st;
	struct pp_agg_key4 k4 = {}, o4 = {};
	struct pp_agg_key6 k6 = {}, o6 = {};
	__u32 zero = 0, *active;
	void *map, *key, *other;
	__u64 a6;
	long err;

	active = bpf_map_lookup_elem(&agg_active, &zero);
	if (!active)
		return NULL;
	if (ipv == 4) {
		k4.prefix = ip->in6_u.u6_addr32[3] & pp_cfg.v4_prefix_mask;
		k4.side = side;
		o4.prefix = PP_AGG_OTHER_V4;
		o4.side = side;
		map = *active ? (void *)&agg4_1 : (void *)&agg4_0;
		key = &k4;
		other = &o4;
	} else {
		__builtin_memcpy(&a6, ip, sizeof(a6));
		k6.prefix = a6 & pp_cfg.v6_prefix_mask;
		k6.side = side;
		o6.prefix = PP_AGG_OTHER_V6;
		o6.side = side;
		map = *active ? (void *)&agg6_1 : (void *)&agg6_0;
		key = &k6;
		other = &o6;
	}
	st = bpf_map_lookup_elem(map, key);
	if (st)
		return st;
	if (!create)
		return bpf_map_lookup_elem(map, other);
	err = bpf_map_update_elem(map, key, &pp_zero_agg, BPF_NOEXIST);
	if (err && err != -EEXIST) {
		COUNT(cnt, agg_map_full);
		return bpf_map_lookup_elem(map, other);
	}
	return bpf_map_lookup_elem(map, key);
}

/* Adds an RTT to the histogram of a subnet. */
static __always_inline void pp_agg_rtt(const struct in6_addr *ip, __u8 ipv, __u8 side,
				       __u64 rtt, struct pp_counters *cnt)
{
	struct pp_agg_stats *st = pp_agg_get(ip, ipv, side, 1, cnt);
	__u32 bin;

	if (!st)
		return;
	st->count++;
	st->sum_ns += rtt;
	if (!st->min_ns || rtt < st->min_ns)
		st->min_ns = rtt;
	if (rtt > st->max_ns)
		st->max_ns = rtt;
	bin = pp_hist_bin(rtt);
	if (bin < PP_HIST_BINS)
		st->bins[bin]++;
}

/* Adds a sample whose reply is the packet pp carries: to the subnet of the reply's source
 * (or destination), on the side it is on. */
static __always_inline void pp_aggregate(const struct pp_pkt *pp, __u64 rtt,
					 struct pp_counters *cnt)
{
	/* The reply's source is remote when it arrived, local when it left. */
	__u8 side = pp->is_ingress ? PP_SIDE_REMOTE : PP_SIDE_LOCAL;

	if (pp_cfg.agg_by_dst)
		pp_agg_rtt(&pp->pid.flow.daddr, pp->pid.flow.ipv, side ^ 1, rtt, cnt);
	else
		pp_agg_rtt(&pp->pid.flow.saddr, pp->pid.flow.ipv, side, rtt, cnt);
}

static __always_inline void pp_traffic_add(struct pp_traffic *t, const struct pkt *p,
					   int measured, __u32 len)
{
	if (p->l4_proto != IPPROTO_TCP) {
		t->other_pkts++;
		t->other_bytes += len;
	} else if (measured) {
		t->tcp_ts_pkts++;
		t->tcp_ts_bytes += len;
	} else {
		t->tcp_nots_pkts++;
		t->tcp_nots_bytes += len;
	}
}

/* Counts an IP packet of len bytes under the subnets of both its endpoints (aggregation
 * mode): the one on the far side of the interface as remote, the other as local; rx when it
 * arrived (ingress), tx when it left. measured: the packet carries an identifier or an echo,
 * which for TCP means the timestamp option (ePPing's TCP_TS). */
static __always_inline void pp_count_traffic(const struct pp_pkt *pp, int ingress, int measured,
					     __u32 len, struct pp_counters *cnt)
{
	const struct pkt *p = &pp->p;
	const struct in6_addr *remote = ingress ? &p->saddr : &p->daddr;
	const struct in6_addr *local = ingress ? &p->daddr : &p->saddr;
	__u8 ipv = p->l3_proto == ETH_P_IP ? 4 : 6;
	struct pp_agg_stats *st;

	st = pp_agg_get(remote, ipv, PP_SIDE_REMOTE, measured, cnt);
	if (st)
		pp_traffic_add(ingress ? &st->rx : &st->tx, p, measured, len);
	st = pp_agg_get(local, ipv, PP_SIDE_LOCAL, measured, cnt);
	if (st)
		pp_traffic_add(ingress ? &st->rx : &st->tx, p, measured, len);
}

/* Updates the flow's RTT statistics with a sample and reports it. flow: the reply's direction;
 * d, req: the request direction's shared state and bookkeeping; rep: the reply direction's. */
static __always_inline void pp_sample(struct pp_dir_shared *d, const struct pp_dir_own *req,
				      const struct pp_dir_own *rep, const struct pp_pkt *pp,
				      __u64 rtt, __u64 id, __u8 id_len, struct pp_counters *cnt)
{
	if (!d->min_rtt || rtt < d->min_rtt)
		d->min_rtt = rtt;
	d->srtt = d->srtt ? d->srtt - (d->srtt >> 3) + (rtt >> 3) : rtt;
	COUNT(cnt, match_rtt);
	pp_debug("rtt %llu ns id %llu", rtt, id);
	if (pp_cfg.push_events) {
		struct pp_sample_out o = {
			.rtt = rtt, .min_rtt = d->min_rtt, .srtt = d->srtt,
			.sent_pkts = req->pkts, .sent_bytes = req->bytes,
			.rec_pkts = rep->pkts, .rec_bytes = rep->bytes,
			.id = id, .id_len = id_len, .on_egress = !pp->is_ingress,
		};

		/* The request direction is the reverse of the packet's. */
		pp_dc_pending(&pp->reply.flow, &o.sent_pkts, &o.sent_bytes);
		pp_dc_pending(&pp->pid.flow, &o.rec_pkts, &o.rec_bytes);
		pp_send_rtt(cnt, &pp->pid.flow, pp->now, &o);
	}
	if (pp_cfg.aggregate)
		pp_aggregate(pp, rtt, cnt);
}

/* Matches the packet's echo against the identifiers stored for the reverse direction (d,
 * o: its shared state and bookkeeping; own: the packet's direction's). */
static __always_inline void pp_match(struct pp_dir_shared *d, struct pp_dir_own *o,
				     const struct pp_dir_own *own, struct pp_pkt *pp,
				     struct pp_counters *cnt)
{
	__u64 *stored, t0, rtt, last_sent, now;
	int pure_ack;

	if (!pp->f.reply_valid)
		return;
	if (!pp_active(d) || d->outstanding == 0) {
		COUNT(cnt, match_none);
		return;
	}
	if (pp->reply.flow.proto == IPPROTO_TCP)
		pp_retire(d, pp, cnt);
	stored = bpf_map_lookup_elem(&pkt_ts, &pp->reply);
	if (!stored) {
		COUNT(cnt, match_miss);
		return;
	}
	t0 = *stored & ~PP_TS_PURE_ACK;
	pure_ack = *stored & PP_TS_PURE_ACK;
	now = pp_now(pp);
	if (now < t0) {
		COUNT(cnt, match_clock);
		return;
	}
	/* Whoever deletes the entry owns the sample: a duplicated reply on another CPU finds
	 * it gone and counts a miss instead of a second sample. */
	if (bpf_map_delete_elem(&pkt_ts, &pp->reply) != 0) {
		COUNT(cnt, match_miss);
		return;
	}
	if (d->outstanding)
		__sync_fetch_and_add(&d->outstanding, -1);
	pp_hint_add(&pp->reply.flow, -1);
	/* A pure ACK is echoed by the far end's next segment whenever that is sent: at once
	 * by a sender with data waiting for the window, or after any pause of an application
	 * that had nothing to send. Accept the echo if the far end sent something after the
	 * last packet that carried the identifier (several ACKs within one tick of the TSval
	 * clock carry the same one), so it was still sending when that ACK left, or if it was
	 * silent for less than the flow's min RTT (back-to-back segments of a busy sender on a
	 * path shorter than the tick). Otherwise the sample would contain the pause. The far
	 * end's packets are timed in ns since the first pure ACK was stored (ns_seen). */
	last_sent = pp->reply.id == o->last_id ? o->last_id_time : t0;
	if (pure_ack && pp->prev_seen <= last_sent &&
	    !(d->min_rtt && now - pp->prev_seen < d->min_rtt)) {
		COUNT(cnt, match_ack_idle);
		return;
	}
	rtt = now - t0;
	pp_sample(d, o, own, pp, rtt, pp->reply.id, 0, cnt);
}

/* Applies FIN/RST: closes the packet's direction (and for RST the reverse one too), reports
 * directions that were open, and deletes the flow once neither direction is active. Flow
 * events name the flow reply-side first, like RTT events; "source" is relative to that. */
static __always_inline void pp_close(struct pp_flow_state *fs, struct pp_dir_shared *fwd,
				     struct pp_dir_shared *rev, struct pp_pkt *pp,
				     struct pp_counters *cnt)
{
	const struct pp_tuple *key = pp->fwd == 0 ? &pp->pid.flow : &pp->reply.flow;
	__u8 was;

	if (pp->f.event != PP_FLOW_CLOSING)
		return;
	was = pp_conn_move(fs, fwd, 0xff, PP_CONN_CLOSED);
	if (was == PP_CONN_OPEN && pp_cfg.push_events)
		pp_send_flow(cnt, &pp->reply.flow, pp_now(pp), PP_FLOW_CLOSING, pp->f.reason,
			     PP_SOURCE_PKT_DEST);
	if (was == PP_CONN_WAITOPEN || was == PP_CONN_OPEN)
		COUNT(cnt, flow_closed);
	if (was == PP_CONN_WAITOPEN)
		pp_hint_add(&pp->pid.flow, -1);
	if (pp->f.close_both) {
		was = pp_conn_move(fs, rev, 0xff, PP_CONN_CLOSED);
		if (was == PP_CONN_OPEN && pp_cfg.push_events)
			pp_send_flow(cnt, &pp->pid.flow, pp_now(pp), PP_FLOW_CLOSING, pp->f.reason,
				     PP_SOURCE_PKT_SRC);
		if (was == PP_CONN_WAITOPEN || was == PP_CONN_OPEN)
			COUNT(cnt, flow_closed);
		if (was == PP_CONN_WAITOPEN)
			pp_hint_add(&pp->reply.flow, -1);
	}
	if (!pp_active(fwd) && !pp_active(rev) && bpf_map_delete_elem(&flows, key) == 0) {
		COUNT(cnt, flow_deleted);
		pp_dc_drop(&pp->pid.flow);
		pp_dc_drop(&pp->reply.flow);
	}
}

/* QUIC's spin bit (RFC 9000 section 17.4, RFC 9312 section 3.8). The client (the endpoint
 * that sends to the QUIC port) sends the inverse of the last spin value it received, the
 * server the value it received, so each value travels one round: an edge (a changed value)
 * in one direction causes an edge in the other one round-trip of the observer later. The
 * time from an edge to the edge it causes is a sample: the RTT from this interface to the
 * endpoint that reflected it, as a TCP echo measures it.
 *
 * A flip is an edge only if the reverse direction explains it: the client flips to v after
 * seeing the server send !v, the server to v after seeing the client send v; and if it
 * comes at least half the flow's min RTT after the direction's last edge (edges are a spin
 * period apart, and a period is longer than the RTT of either side of the monitor): a
 * reordered packet that brings an old value back fails one test or the other (RFC 9312
 * section 3.8.2's heuristics) and is rejected (quic_edge_rejected), changing nothing. A
 * packet delayed by more than half the min RTT and arriving after the reverse direction
 * flipped passes both: reordering that deep yields a short sample, a limit of the method.
 * (A stricter spacing rejects real edges whose predecessor was delayed by jitter, and then
 * every packet until the spacing is reached, inflating the next sample: half is the
 * compromise.)
 * An endpoint that disables the spin bit sends a fixed or random value (RFC 9000); a fixed
 * one never flips (quic_spin_idle counts its packets), a random one seldom passes the
 * check. A new destination connection id restarts both directions (endpoints reset the
 * value when they change ids). Edges are rate-limited like identifiers and a local
 * direction's edges are not stored (the host's own reaction time, -l). */
static __always_inline void pp_quic(struct pp_dir_shared *fwd, struct pp_dir_own *fo,
				    struct pp_dir_shared *rev, struct pp_dir_own *ro,
				    struct pp_pkt *pp, struct pp_counters *cnt)
{
	__u8 s = pp->quic.spin, want;
	__u64 cid, now, rtt, period;

	if (pp->quic.form == PP_QUIC_FORM_LONG) {
		/* The sender's source id is what the reverse direction's short headers carry. */
		if (!rev->cid_known || rev->cid_len != pp->quic.cid_len) {
			rev->cid_len = pp->quic.cid_len;
			rev->cid_known = 1;
		}
		return;
	}
	if (fwd->cid_known) {
		/* The destination id's first bytes: the bytes read, cut to its length. */
		cid = pp->quic.cid;
		if (fwd->cid_len < PP_QUIC_ID_BYTES)
			cid = fwd->cid_len ? cid & ~(~0ULL >> (8 * fwd->cid_len)) : 0;
		if (fwd->spin_state != PP_SPIN_UNKNOWN && cid != fo->last_id) {
			COUNT(cnt, quic_cid_changed);
			fwd->spin_state = PP_SPIN_UNKNOWN;
			fwd->edge_pending = 0;
			fwd->last_edge = 0;
			rev->edge_pending = 0;
		}
		fo->last_id = cid;
	}
	if (fwd->spin_state == PP_SPIN_UNKNOWN) {
		fwd->spin = s;
		fwd->spin_state = PP_SPIN_SEEN;
		COUNT(cnt, quic_spin_idle);
		return;
	}
	if (s == fwd->spin) {
		if (fwd->spin_state == PP_SPIN_SEEN)
			COUNT(cnt, quic_spin_idle);
		return;
	}
	want = pp->quic.to_server ? !s : s;
	if (rev->spin_state == PP_SPIN_UNKNOWN || rev->spin != want) {
		COUNT(cnt, quic_edge_rejected);
		return;
	}
	now = pp_now(pp);
	period = fwd->min_rtt > rev->min_rtt ? fwd->min_rtt : rev->min_rtt;
	if (fwd->last_edge && now >= fwd->last_edge && now - fwd->last_edge < period / 2) {
		COUNT(cnt, quic_edge_rejected);
		return;
	}
	fwd->spin = s;
	fwd->spin_state = PP_SPIN_FLIPPED;
	fwd->last_edge = now;
	COUNT(cnt, quic_edge);
	/* The edge answers the reverse direction's stored edge: a sample. */
	if (rev->edge_pending) {
		rev->edge_pending = 0;
		if (now >= rev->edge_time) {
			rtt = now - rev->edge_time;
			__u8 len = pp->quic.to_server ? fwd->cid_len : rev->cid_len;

			pp_sample(rev, ro, fo, pp, rtt, pp->quic.to_server ? fo->last_id : ro->last_id,
				  len < PP_QUIC_ID_BYTES ? len : PP_QUIC_ID_BYTES, cnt);
		} else {
			COUNT(cnt, match_clock);
		}
	}
	/* And is a request itself. */
	if (!pp_timed(fwd, cnt))
		return;
	if (fwd->has_ts && pp_rate_limited(fwd, pp)) {
		COUNT(cnt, ts_rate_limited);
		return;
	}
	fwd->has_ts = 1;
	fwd->last_ts = now;
	fwd->last_ts_j = pp->jiff;
	fwd->edge_time = now;
	fwd->edge_pending = 1;
	COUNT(cnt, ts_stored);
}

/* The per-packet pipeline after identification: flow state, the packet's own bookkeeping,
 * request side, reply side, closing. */
static __always_inline void pp_process(void *ctx, struct pp_pkt *pp, struct pp_counters *cnt)
{
	struct pp_flow_state *fs = pp_flow_get(pp, cnt);
	struct pp_dir_shared *fwd, *rev;
	struct pp_dir_own *fo, *ro;

	if (!fs)
		return;
	if (pp->fwd) {
		fwd = &fs->shared[1];
		rev = &fs->shared[0];
		fo = &fs->own1;
		ro = &fs->own0;
	} else {
		fwd = &fs->shared[0];
		rev = &fs->shared[1];
		fo = &fs->own0;
		ro = &fs->own1;
	}

	/* The packet's own direction: open it on its first request, count the packet. */
	if (fwd->conn == PP_CONN_EMPTY && pp->f.pid_valid)
		pp_dir_open(fs, fwd, fo, pp,
			    pp->is_ingress && pp_cfg.localfilt && pp_dst_is_local(ctx, pp));
	fo->pkts++;
	fo->bytes += pp->payload_len;
	fo->last_seen = pp->jiff;
	if (fwd->ns_seen) {
		pp->prev_seen = fo->last_seen_ns;
		fo->last_seen_ns = pp_now(pp);
	} else {
		pp->prev_seen = 0;
	}

	/* The reverse direction answers: it is open from its first reply on. */
	if (rev->conn == PP_CONN_WAITOPEN && !pp->f.close_both &&
	    pp_conn_move(fs, rev, PP_CONN_BIT(PP_CONN_WAITOPEN), PP_CONN_OPEN) ==
		    PP_CONN_WAITOPEN) {
		pp_hint_add(&pp->reply.flow, -1);
		COUNT(cnt, flow_opened);
		if (pp_cfg.push_events)
			pp_send_flow(cnt, &pp->pid.flow, pp_now(pp), PP_FLOW_OPENING,
				     rev->open_reason, PP_SOURCE_PKT_DEST);
	}

	if (pp->quic.form) {
		pp_quic(fwd, fo, rev, ro, pp, cnt);
		return;
	}
	pp_timestamp(fwd, fo, rev, pp, cnt); /* request side */
	pp_match(rev, ro, fo, pp, cnt);      /* reply side */
	if (!pp_cfg.no_fast_path)
		pp_dc_fill(fwd, fo, pp);
	pp_close(fs, fwd, rev, pp, cnt);
}

#endif /* KEDGE_PPING_FLOW_H */
