/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* flow.h - per-flow state, timestamping requests, matching replies, aggregation.
 *
 * Concurrency: ingress and egress of one flow may run on two CPUs at once and both write
 * the flow's state. Counters that must stay consistent (outstanding) are atomic; the
 * statistics (packet counts, min/smoothed RTT, rate-limit time) may lose an update under
 * such a race, which costs at most one sample or one count, as in ePPing. */
#ifndef KEDGE_PPING_FLOW_H
#define KEDGE_PPING_FLOW_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "counters.h"
#include "hist.h"
#include "parse.h"
#include "proto.h"
#include "pping.h"
#include "maps.h"
#include "ident.h"

/* An unmatched identifier expires after this many smoothed RTTs (clamped, see config). */
#define PP_TS_RTT_MULT 8

/* How long a direction's identifiers live: clamp(8 x srtt, ts_min_lifetime, ts_max_lifetime),
 * so a short-RTT flow's lost replies are forgotten quickly and a long-RTT flow keeps its
 * identifiers long enough to be matched. User space's collector (internal/pping/gc.go)
 * deletes expired identifiers by the same rule. */
static __always_inline __u64 pp_ts_lifetime(const struct pp_dir_state *d)
{
	__u64 life = pp_cfg.ts_max_lifetime_ns;

	if (d->srtt && d->srtt * PP_TS_RTT_MULT < life)
		life = d->srtt * PP_TS_RTT_MULT;
	if (life < pp_cfg.ts_min_lifetime_ns)
		life = pp_cfg.ts_min_lifetime_ns;
	return life;
}

static __always_inline int pp_active(const struct pp_dir_state *d)
{
	return d->conn == PP_CONN_WAITOPEN || d->conn == PP_CONN_OPEN;
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

static __always_inline void pp_dir_open(struct pp_dir_state *d, const struct pp_pkt *pp,
					__u8 local)
{
	d->conn = PP_CONN_WAITOPEN;
	d->open_reason = pp->event == PP_FLOW_OPENING ? pp->reason : PP_REASON_FIRST_PKT;
	d->last_id = pp->pid.id;
	d->last_id_time = pp->now;
	d->last_seen = pp->now;
	d->has_ts = 0;
	d->local = local;
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
	 * before the monitor, or already closed) would only create state nobody matches. */
	if (!pp->pid_valid || pp->event == PP_FLOW_CLOSING) {
		COUNT(cnt, skip_no_flow);
		return NULL;
	}
	err = bpf_map_update_elem(&flows, key, &pp_zero_flow, BPF_NOEXIST);
	if (err == 0) {
		COUNT(cnt, flow_created);
	} else if (err != -EEXIST) {
		COUNT(cnt, flow_map_full);
		pp_warn_full(cnt, &pp->pid.flow, pp->now, PP_MAP_FLOWS);
		return NULL;
	}
	return bpf_map_lookup_elem(&flows, key);
}

static __always_inline int pp_rate_limited(const struct pp_dir_state *d, __u64 now)
{
	__u64 rtt = pp_cfg.use_srtt ? d->srtt : d->min_rtt;
	__u64 gap = pp_cfg.rate_limit_ns;

	if (now < d->last_ts)
		return 1;
	if (pp_cfg.rtt_rate && rtt)
		gap = (pp_cfg.rtt_rate * rtt) >> PP_FIXPOINT_SHIFT;
	return now - d->last_ts < gap;
}

/* TCP timestamps only grow (modulo 2^32, RFC 7323 section 5.2): a TSval is new when it is
 * ahead of the last one by less than 2^31. Other identifiers are new when they differ. */
static __always_inline int pp_id_is_new(const struct pp_pkt *pp, const struct pp_dir_state *d)
{
	if (pp->pid.flow.proto == IPPROTO_TCP) {
		__u32 delta = (__u32)pp->pid.id - (__u32)d->last_id;

		return delta != 0 && delta < (1U << 31);
	}
	return pp->pid.id != d->last_id;
}

/* Stores the packet's identifier with the current time, if the direction is measured, the
 * identifier is new and the rate limit allows it. */
static __always_inline void pp_timestamp(struct pp_dir_state *d, struct pp_pkt *pp,
					 struct pp_counters *cnt)
{
	__u64 stamp;
	long err;

	if (!pp->pid_valid)
		return;
	if (!pp_active(d)) {
		COUNT(cnt, ts_inactive);
		return;
	}
	if (d->local) {
		COUNT(cnt, ts_local);
		return;
	}
	/* A datagram identifier sent again while outstanding is a retransmission: its reply
	 * cannot tell which copy it answers (Karn), so the sample is discarded. */
	if (pp->pid.flow.proto != IPPROTO_TCP && bpf_map_delete_elem(&pkt_ts, &pp->pid) == 0) {
		if (d->outstanding)
			__sync_fetch_and_add(&d->outstanding, -1);
		COUNT(cnt, ts_retrans);
		return;
	}
	if ((d->has_ts || pp->wait_edge) && !pp_id_is_new(pp, d)) {
		if (pp->pid.id == d->last_id)
			d->last_id_time = pp->now;
		COUNT(cnt, ts_not_new);
		return;
	}
	d->last_id = pp->pid.id;
	d->last_id_time = pp->now;
	if (d->has_ts && pp_rate_limited(d, pp->now)) {
		COUNT(cnt, ts_rate_limited);
		return;
	}
	/* Count the attempt even if the map is full, so a full map does not turn every packet
	 * of a busy flow into another failed insert. */
	d->has_ts = 1;
	d->last_ts = pp->now;
	stamp = (pp->now & ~PP_TS_PURE_ACK) | (pp->pure_ack ? PP_TS_PURE_ACK : 0);
	err = bpf_map_update_elem(&pkt_ts, &pp->pid, &stamp, BPF_NOEXIST);
	if (err == 0) {
		__sync_fetch_and_add(&d->outstanding, 1);
		COUNT(cnt, ts_stored);
		pp_debug("stored id %llu", pp->pid.id);
	} else if (err == -EEXIST) {
		COUNT(cnt, ts_exists);
	} else {
		COUNT(cnt, ts_map_full);
		pp_warn_full(cnt, &pp->pid.flow, pp->now, PP_MAP_PKT_TS);
	}
}

/* Histogram bucket of an RTT in ns (layout in pping.h). */
static __always_inline __u32 pp_hist_bin(__u64 rtt)
{
	return hist_bucket(rtt, PP_HIST_SUB_BITS, PP_HIST_MIN_SHIFT, PP_HIST_BINS);
}

/* The active buffer's entry for the subnet of ip. A missing subnet is created when create is
 * set (a packet the monitor measures), else, and when the map is full (agg_map_full), the
 * "other" entry stands in: unmeasurable traffic, a spoofed-source flood for instance, cannot
 * fill the map with subnets of its own (ePPing's rule). */
static __always_inline struct pp_agg_stats *pp_agg_get(const struct in6_addr *ip, __u8 ipv,
							int create, struct pp_counters *cnt)
{
	struct pp_agg_stats *st;
	__u32 zero = 0, *active, key4, other4 = PP_AGG_OTHER_V4;
	__u64 key6, other6 = PP_AGG_OTHER_V6;
	void *map, *key, *other;
	long err;

	active = bpf_map_lookup_elem(&agg_active, &zero);
	if (!active)
		return NULL;
	if (ipv == 4) {
		key4 = ip->in6_u.u6_addr32[3] & pp_cfg.v4_prefix_mask;
		map = *active ? (void *)&agg4_1 : (void *)&agg4_0;
		key = &key4;
		other = &other4;
	} else {
		__builtin_memcpy(&key6, ip, sizeof(key6));
		key6 &= pp_cfg.v6_prefix_mask;
		map = *active ? (void *)&agg6_1 : (void *)&agg6_0;
		key = &key6;
		other = &other6;
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

/* Adds an RTT to the histogram of the subnet of the reply's source (or destination). */
static __always_inline void pp_aggregate(const struct pp_pkt *pp, __u64 rtt,
					 struct pp_counters *cnt)
{
	const struct in6_addr *ip = pp_cfg.agg_by_dst ? &pp->pid.flow.daddr : &pp->pid.flow.saddr;
	struct pp_agg_stats *st = pp_agg_get(ip, pp->pid.flow.ipv, 1, cnt);
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

/* Counts an IP packet of len bytes as received from its source's subnet and sent to its
 * destination's (aggregation mode). measured: the packet carries an identifier or an echo,
 * which for TCP means the timestamp option (ePPing's TCP_TS). */
static __always_inline void pp_count_traffic(const struct pp_pkt *pp, int measured, __u32 len,
					     struct pp_counters *cnt)
{
	const struct pkt *p = &pp->p;
	__u8 ipv = p->l3_proto == ETH_P_IP ? 4 : 6;
	struct pp_agg_stats *st;

	st = pp_agg_get(&p->saddr, ipv, measured, cnt);
	if (st)
		pp_traffic_add(&st->rx, p, measured, len);
	st = pp_agg_get(&p->daddr, ipv, measured, cnt);
	if (st)
		pp_traffic_add(&st->tx, p, measured, len);
}

/* Matches the packet's echo against the identifiers stored for the reverse direction. */
static __always_inline void pp_match(struct pp_dir_state *d, struct pp_pkt *pp,
				     struct pp_counters *cnt)
{
	__u64 *stored, t0, rtt, last_sent;
	int pure_ack;

	if (!pp->reply_valid)
		return;
	if (!pp_active(d) || d->outstanding == 0) {
		COUNT(cnt, match_none);
		return;
	}
	stored = bpf_map_lookup_elem(&pkt_ts, &pp->reply);
	if (!stored) {
		/* The collector deletes expired identifiers but cannot decrement the count (it is
		 * not atomic from user space): once the newest identifier of the direction is past
		 * its lifetime, every one of them is, so nothing is outstanding any more. */
		if (pp->now > d->last_ts && pp->now - d->last_ts > pp_ts_lifetime(d))
			d->outstanding = 0;
		COUNT(cnt, match_miss);
		return;
	}
	t0 = *stored & ~PP_TS_PURE_ACK;
	pure_ack = *stored & PP_TS_PURE_ACK;
	if (pp->now < t0) {
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
	/* A pure ACK is echoed by the far end's next segment whenever that is sent: at once
	 * by a sender with data waiting for the window, or after any pause of an application
	 * that had nothing to send. Accept the echo if the far end sent something after the
	 * last packet that carried the identifier (several ACKs within one tick of the TSval
	 * clock carry the same one), so it was still sending when that ACK left, or if it was
	 * silent for less than the flow's min RTT (back-to-back segments of a busy sender on a
	 * path shorter than the tick). Otherwise the sample would contain the pause. */
	last_sent = pp->reply.id == d->last_id ? d->last_id_time : t0;
	if (pure_ack && pp->prev_seen <= last_sent &&
	    !(d->min_rtt && pp->now - pp->prev_seen < d->min_rtt)) {
		COUNT(cnt, match_ack_idle);
		return;
	}
	rtt = pp->now - t0;
	if (!d->min_rtt || rtt < d->min_rtt)
		d->min_rtt = rtt;
	d->srtt = d->srtt ? d->srtt - (d->srtt >> 3) + (rtt >> 3) : rtt;
	COUNT(cnt, match_rtt);
	pp_debug("rtt %llu ns id %llu", rtt, pp->reply.id);
	if (pp_cfg.push_events)
		pp_send_rtt(cnt, &pp->pid.flow, d, pp->now, rtt, pp->reply.id, !pp->is_ingress);
	if (pp_cfg.aggregate)
		pp_aggregate(pp, rtt, cnt);
}

/* Applies FIN/RST: closes the packet's direction (and for RST the reverse one too), reports
 * directions that were open, and deletes the flow once neither direction is active. Flow
 * events name the flow reply-side first, like RTT events; "source" is relative to that. */
static __always_inline void pp_close(struct pp_flow_state *fs, struct pp_dir_state *fwd,
				     struct pp_dir_state *rev, const struct pp_pkt *pp,
				     struct pp_counters *cnt)
{
	const struct pp_tuple *key = pp->fwd == 0 ? &pp->pid.flow : &pp->reply.flow;

	if (pp->event != PP_FLOW_CLOSING)
		return;
	if (fwd->conn == PP_CONN_OPEN && pp_cfg.push_events)
		pp_send_flow(cnt, &pp->reply.flow, pp->now, PP_FLOW_CLOSING, pp->reason,
			     PP_SOURCE_PKT_DEST);
	if (pp_active(fwd))
		COUNT(cnt, flow_closed);
	fwd->conn = PP_CONN_CLOSED;
	if (pp->close_both) {
		if (rev->conn == PP_CONN_OPEN && pp_cfg.push_events)
			pp_send_flow(cnt, &pp->pid.flow, pp->now, PP_FLOW_CLOSING, pp->reason,
				     PP_SOURCE_PKT_SRC);
		if (pp_active(rev))
			COUNT(cnt, flow_closed);
		rev->conn = PP_CONN_CLOSED;
	}
	if (!pp_active(fwd) && !pp_active(rev) && bpf_map_delete_elem(&flows, key) == 0)
		COUNT(cnt, flow_deleted);
}

/* The per-packet pipeline after identification: flow state, request side, reply side,
 * closing. */
static __always_inline void pp_process(void *ctx, struct pp_pkt *pp, struct pp_counters *cnt)
{
	struct pp_flow_state *fs = pp_flow_get(pp, cnt);
	struct pp_dir_state *fwd, *rev;

	if (!fs)
		return;
	fwd = pp->fwd ? &fs->dir[1] : &fs->dir[0];
	rev = pp->fwd ? &fs->dir[0] : &fs->dir[1];

	/* Request side: this packet's direction. */
	if (fwd->conn == PP_CONN_EMPTY && pp->pid_valid)
		pp_dir_open(fwd, pp, pp->is_ingress && pp_cfg.localfilt && pp_dst_is_local(ctx, pp));
	pp->prev_seen = fwd->last_seen;
	if (pp_active(fwd)) {
		fwd->sent_pkts++;
		fwd->sent_bytes += pp->payload_len;
		fwd->last_seen = pp->now;
	}
	pp_timestamp(fwd, pp, cnt);

	/* Reply side: the reverse direction's requests. */
	if (pp_active(rev)) {
		if (rev->conn == PP_CONN_WAITOPEN && !pp->close_both) {
			rev->conn = PP_CONN_OPEN;
			COUNT(cnt, flow_opened);
			if (pp_cfg.push_events)
				pp_send_flow(cnt, &pp->pid.flow, rev->last_seen, PP_FLOW_OPENING,
					     rev->open_reason, PP_SOURCE_PKT_DEST);
		}
		rev->rec_pkts++;
		rev->rec_bytes += pp->payload_len;
	}
	pp_match(rev, pp, cnt);

	pp_close(fs, fwd, rev, pp, cnt);
}

#endif /* KEDGE_PPING_FLOW_H */
