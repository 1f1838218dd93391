/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* pacer.h - kedge's in-kernel pacer: gives a consumer's BPF code a packet context (an skb it
 * may rewrite, redirect and clone) at times it chooses. docs/pacer.md is the interface;
 * internal/pacer builds the backend and attaches the programs. Used by hedging (the rescuer:
 * due hedges) and meant for Raft (the leader's heartbeats).
 *
 * Topology (internal/pacer makes one per consumer, in a kedge-owned namespace):
 *
 *   consumer netns            pacer netns
 *   <ifname>t (veth) ======= tick peer --+
 *                                         pacer_enter --> dev [qdisc: fq | netem | tbf] == dev_end
 *   <ifname> (veth) ======== peer -------+
 *      ^  TC ingress:                                                                 |
 *      |  the consumer's                                       pacer_pass (TC ingress)|
 *      |  tick program       <------------------ peer (egress) <----- due ----------- +
 *                                                                 not due: round again (dev)
 *
 * Two things ride it:
 *  - ticks: a consumer calls pacer_request(skb, deadline) from any TC program in its
 *    namespace. At most one tick is in flight, at the earliest deadline requested: a request
 *    for a later deadline than the armed one costs a map read. The pacer clones the skb in
 *    (through a second veth, <ifname>'s tick twin, so the entry tells requests apart),
 *    turns the clone into a tick frame (Ethernet, IPv4 protocol PACER_IPPROTO, pacer_tick)
 *    and holds it until the deadline: edt stamps skb->tstamp and fq releases it; netem and
 *    the conveyor send it round (one pass = netem's delay, or one tick frame's transmission
 *    time at the tbf rate) until it is due. The tick arrives at the consumer's tick program
 *    (TC ingress of <ifname>), which calls pacer_receive() first and then owns the skb: it may
 *    bpf_skb_change_tail / bpf_skb_store_bytes it into any frame, bpf_clone_redirect it to
 *    several destinations and bpf_redirect(_neigh) or drop it. A consumer that still has
 *    work pending asks for its next tick (pacer_request, any time, with any skb). Nothing
 *    pending, nothing ticks (the conveyor's filler queue excepted, see carry below).
 *  - carried packets (the clone path): pacer_carry(skb) clones a packet in; it comes back to
 *    the tick program after one pass (edt: at pacer_carry_deadline(skb)), and the consumer
 *    sends it round again with pacer_recirculate() while not due. On the conveyor a pass
 *    lasts as long as the filler queue (user space keeps it at the configured period).
 *
 * The consumer includes this header once (it defines the pacer's maps and pacer_cfg), defines
 *   static __always_inline __u64 pacer_carry_deadline(struct __sk_buff *skb);
 * (edt only: a carried packet's deadline, 0 if unknown; return 0 if nothing is carried) and
 * wraps the two pacer programs in its own SEC("tc") functions (any names):
 *   SEC("tc") int x_enter(struct __sk_buff *skb) { return pacer_enter(skb); }
 *   SEC("tc") int x_pass(struct __sk_buff *skb)  { return pacer_pass(skb); }
 * Everything here runs in TC (sched_cls) programs only. */
#ifndef KEDGE_PACER_H
#define KEDGE_PACER_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "parse.h"
#include "csum.h"

enum pacer_backend {
	PACER_CONVEYOR = 0, /* tbf: the tick frame (or the filler queue) paces the passes */
	PACER_NETEM = 1,    /* netem: a fixed delay per pass */
	PACER_EDT = 2,      /* fq: skb->tstamp = deadline, one pass */
};

/* Frames and marks of the pacer. An enum so bpf2go carries them to Go. */
enum pacer_consts {
	/* Tick frames are IPv4 (so skb->protocol is ETH_P_IP when the consumer gets one, as
	 * bpf_redirect_neigh and bpf_skb_change_proto need) with this protocol number
	 * (RFC 3692 experimentation), addresses 0.0.0.0 and TTL 0; never routed. */
	PACER_IPPROTO = 253,
	PACER_FILLER_ETH_P = ETH_P_KEDGE_FILLER, /* conveyor filler frames (proto.h) */
	PACER_TICK_MIN_BYTES = 128,   /* smallest tick frame: Ethernet + IPv4 + pacer_tick, and
				       * room above the transport offset of the clone it is
				       * made from (bpf_skb_change_tail cannot cut below it) */
	PACER_LATE_BUCKETS = 24,      /* lateness histogram: bucket i holds [2^(i-1), 2^i) us */
	PACER_REQUEST_TRIES = 3,      /* compare-and-swap attempts when CPUs arm at once */
};

enum pacer_magic {
	PACER_TICK_MAGIC = 0x6b65646765746b21ULL,   /* "kedgetk!" */
	PACER_FILLER_MAGIC = 0x6b65646765666c6cULL, /* "kedgefll" */
};

/* pacer_request results. */
enum pacer_req {
	PACER_ERR = -1,       /* the clone into the pacer failed (counted: arm_errors) */
	PACER_COALESCED = 0,  /* a tick at or before this deadline is already in flight */
	PACER_ARMED = 1,      /* a tick was sent in for this deadline */
};

/* pacer_receive results: what arrived at the consumer's tick program. */
enum pacer_rx {
	PACER_RX_TICK = 0,      /* a tick: the struct pacer_tick was copied out */
	PACER_RX_CARRIED = 1,   /* a carried packet, back after a pass */
	PACER_RX_MALFORMED = 2, /* a tick frame that is too short or has a bad magic: drop it */
};

/* The run's constants, set by internal/pacer (Pacer.Configure) before load. */
struct pacer_config {
	__u32 backend;        /* enum pacer_backend */
	__u32 ifindex;        /* consumer netns: the pacer's veth (carried packets in, all out) */
	__u32 peer_ifindex;   /* pacer netns: its peer (pacer_enter; due packets leave here) */
	__u32 tick_ifindex;   /* consumer netns: the veth tick requests are cloned into */
	__u32 tick_peer_ifindex; /* pacer netns: its peer (pacer_enter makes ticks of them) */
	__u32 dev_ifindex;    /* pacer netns: the device carrying the backend's qdisc */
	__u32 tick_bytes;     /* tick frame length (conveyor: length*8/rate is the resolution) */
	__u32 tick_max_bytes; /* conveyor without fillers: a tick not yet due is resized for its
			       * next pass to the bytes whose transmission time is what is left,
			       * up to this (the devices' largest frame); 0: fixed tick_bytes */
	__u32 rate_bytes;     /* conveyor: the tbf rate, bytes per second */
	__u64 early_ns;       /* a tick is due when now + early_ns >= its deadline */
	__u64 carry_early_ns; /* the same for carried packets (half a pass; 0 on edt) */
	__u64 lost_ns;        /* an armed tick this long overdue is presumed lost */
};

/* Shared state (array, one slot). */
struct pacer_state {
	__u64 armed_ns; /* deadline of the earliest tick in flight; 0: none */
	__u64 seq;      /* ticks armed so far (each tick frame carries its number) */
	__u64 fired_ns; /* conveyor with fillers: the armed deadline a filler pass already
			 * delivered (the tick frame in the queue is then superseded) */
};

/* A tick frame's payload, after its Ethernet and IPv4 (20 bytes, no options) headers. */
struct pacer_tick {
	__u64 magic;       /* PACER_TICK_MAGIC */
	__u64 deadline_ns; /* CLOCK_MONOTONIC, as bpf_ktime_get_ns() */
	__u64 sent_ns;     /* when it entered the pacer */
	__u32 seq;
	__u32 passes;      /* netem/conveyor: passes through the qdisc so far */
};

/* Conveyor filler frame payload, after its Ethernet header (PACER_FILLER_ETH_P). */
struct pacer_filler {
	__u64 magic;    /* PACER_FILLER_MAGIC */
	__u64 stamp_ns; /* when it last entered the queue */
};

/* Conveyor control (array, one slot), written by user space. */
struct pacer_ctl {
	__s32 fillers_to_drop; /* remove this many fillers (decremented by BPF) */
	__u32 stop;            /* drop every filler */
};

/* Counters (per-CPU, one slot). Each counts one thing. */
struct pacer_stats {
	__u64 ticks_requested;  /* pacer_request calls */
	__u64 ticks_armed;      /* tick requests sent into the pacer */
	__u64 ticks_coalesced;  /* requests served by a tick already in flight */
	__u64 ticks_lost;       /* armed ticks presumed lost (overdue by lost_ns): re-armed */
	__u64 arm_errors;       /* bpf_clone_redirect into the pacer failed */
	__u64 ticks_entered;    /* tick frames built at the entry */
	__u64 tick_trim_errors; /* bpf_skb_change_tail to tick_bytes failed (frame kept its length) */
	__u64 tick_build_errors; /* writing the tick frame failed: dropped, disarmed */
	__u64 tick_passes;      /* netem/conveyor: tick sent round again, not due */
	__u64 ticks_piggybacked; /* conveyor with fillers: ticks delivered from a filler pass */
	__u64 ticks_superseded; /* tick dropped at the exit: an earlier one was armed after it */
	__u64 ticks_delivered;  /* ticks handed to the consumer (pacer_receive) */
	__u64 ticks_stale;      /* delivered ticks that were no longer the armed one */
	__u64 malformed_ticks;  /* tick frames (IPv4, PACER_IPPROTO, no addresses) whose payload
				 * is short or has a bad magic: dropped */
	__u64 foreign;          /* packets at pacer_enter from another device: dropped */
	__u64 carried_in;       /* carried packets entering */
	__u64 carried_out;      /* carried packets leaving towards the consumer */
	__u64 carried_recirculated; /* carried packets sent round again by the consumer */
	__u64 edt_set;          /* edt: a carried packet's tstamp set from its deadline */
	__u64 edt_no_deadline;  /* edt: carried packet without a deadline (one pass at once) */
	__u64 redirect_errors;  /* a bpf_redirect inside the pacer failed: packet dropped */
	__u64 filler_passes;    /* conveyor filler frames going round */
	__u64 fillers_dropped;  /* removed on request (stop or shrink) */
	__u64 period_sum_ns;    /* conveyor: sum and count of filler round trips */
	__u64 period_count;
	__u64 period_min_ns;
	__u64 period_max_ns;
	__u64 late_sum_ns;      /* delivered ticks: sum, count and max of (arrival - deadline) */
	__u64 late_count;
	__u64 late_max_ns;
	__u64 early_count;      /* delivered ticks that arrived before their deadline */
	__u64 early_max_ns;
	__u64 late_hist[PACER_LATE_BUCKETS]; /* lateness in us: [0,1) [1,2) [2,4) ... */
};

/* Set by user space before load (internal/pacer: Pacer.Configure). */
const volatile struct pacer_config pacer_cfg = {};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pacer_state);
} pacer_arming SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pacer_stats);
} pacer_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct pacer_ctl);
} pacer_control SEC(".maps");

/* Enums referenced here so their BTF reaches bpf2go (-type); nothing reads these. */
const enum pacer_backend *pacer_btf_backend __attribute__((unused));
const enum pacer_consts *pacer_btf_consts __attribute__((unused));
const enum pacer_magic *pacer_btf_magic __attribute__((unused));
const enum pacer_req *pacer_btf_req __attribute__((unused));
const enum pacer_rx *pacer_btf_rx __attribute__((unused));
const struct pacer_tick *pacer_btf_tick __attribute__((unused));
const struct pacer_filler *pacer_btf_filler __attribute__((unused));

#define PACER_COUNT(ps, field) do { typeof(ps) __p = (ps); if (__p) __p->field++; } while (0)

/* The consumer defines it (see the top of this file). */
static __always_inline __u64 pacer_carry_deadline(struct __sk_buff *skb);

static __always_inline struct pacer_stats *pacer_stats_get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&pacer_counters, &zero);
}

static __always_inline struct pacer_state *pacer_state_get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&pacer_arming, &zero);
}

/* ---- the consumer's side ---- */

/* pacer_request asks for a tick at deadline_ns (CLOCK_MONOTONIC, bpf_ktime_get_ns()). skb is
 * any packet the calling TC program holds; it is cloned (into the tick veth) only when a
 * tick has to be armed, and not changed. Returns enum pacer_req. */
static __always_inline int pacer_request(struct __sk_buff *skb, __u64 deadline_ns)
{
	struct pacer_state *st = pacer_state_get();
	struct pacer_stats *ps = pacer_stats_get();
	__u64 now = bpf_ktime_get_ns(), armed = 0;
	int claimed = 0;

	if (!st)
		return PACER_ERR;
	PACER_COUNT(ps, ticks_requested);
	if (!deadline_ns)
		deadline_ns = now; /* 0 means "none" in pacer_state */
	for (int i = 0; i < PACER_REQUEST_TRIES; i++) {
		armed = st->armed_ns;
		if (armed && armed <= deadline_ns && now < armed + pacer_cfg.lost_ns) {
			PACER_COUNT(ps, ticks_coalesced);
			return PACER_COALESCED;
		}
			if (__sync_val_compare_and_swap(&st->armed_ns, armed, deadline_ns) == armed) {
			claimed = 1;
			break;
		}
	}
	if (!claimed) { /* other CPUs kept arming: one of them holds a tick near ours */
		PACER_COUNT(ps, ticks_coalesced);
		return PACER_COALESCED;
	}
	if (armed && now >= armed + pacer_cfg.lost_ns)
		PACER_COUNT(ps, ticks_lost);
	if (bpf_clone_redirect(skb, pacer_cfg.tick_ifindex, 0) < 0) {
		/* Give the slot back to the tick that held it (if any is still in flight). */
		__sync_val_compare_and_swap(&st->armed_ns, deadline_ns, armed);
		PACER_COUNT(ps, arm_errors);
		return PACER_ERR;
	}
	if (st->fired_ns == deadline_ns)
		st->fired_ns = 0; /* a new tick for a deadline a filler pass delivered before */
	__sync_fetch_and_add(&st->seq, 1);
	PACER_COUNT(ps, ticks_armed);
	return PACER_ARMED;
}

/* pacer_carry clones skb into the pacer as a carried packet; 0 or a negative error. */
static __always_inline long pacer_carry(struct __sk_buff *skb)
{
	return bpf_clone_redirect(skb, pacer_cfg.ifindex, 0);
}

/* pacer_recirculate sends a carried packet (received by the tick program) round again;
 * returns the TC verdict (TC_ACT_REDIRECT, or TC_ACT_SHOT when the redirect failed). */
static __always_inline int pacer_recirculate(struct __sk_buff *skb)
{
	struct pacer_stats *ps = pacer_stats_get();
	long ret;

	ret = bpf_redirect(pacer_cfg.ifindex, 0);
	if (ret != TC_ACT_REDIRECT)
		return TC_ACT_SHOT;
	PACER_COUNT(ps, carried_recirculated);
	return ret;
}

/* pacer_due: deadline has come, give or take half a pass (carried: 1, tick: 0). */
static __always_inline int pacer_due(__u64 deadline_ns, __u64 now, int carried)
{
	return now + (carried ? pacer_cfg.carry_early_ns : pacer_cfg.early_ns) >= deadline_ns;
}

/* pacer_tick_of returns the tick frame's payload, or NULL when skb is not a tick frame
 * (*is_tick tells a tick frame with a bad payload from any other packet). */
static __always_inline struct pacer_tick *pacer_tick_of(struct __sk_buff *skb, int *is_tick)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct hdr_cursor nh = { .pos = data };
	struct ethhdr *eth;
	struct iphdr *ip;
	struct pacer_tick *t;
	__u8 flags = 0;

	*is_tick = 0;
	if (parse_ethhdr(&nh, data_end, &eth, &flags) != ETH_P_IP)
		return NULL;
	ip = pkt_hdr(data, data_end, nh.pos - data, sizeof(*ip));
	if (!ip || ip->protocol != PACER_IPPROTO || ip->saddr || ip->daddr)
		return NULL;
	*is_tick = 1;
	t = pkt_hdr(data, data_end, nh.pos - data + sizeof(*ip), sizeof(*t));
	if (ip->ihl != 5 || !t || t->magic != PACER_TICK_MAGIC)
		return NULL;
	return t;
}

static __always_inline __u32 pacer_late_bucket(__u64 us)
{
	__u32 b = 0;

	/* Plain bounded loop: bucket = bit length of us, capped. */
	for (int i = 0; i < PACER_LATE_BUCKETS - 1; i++) {
		if (!us)
			break;
		us >>= 1;
		b++;
	}
	return b;
}

static __always_inline void pacer_record_precision(struct pacer_stats *ps, __u64 now, __u64 deadline)
{
	__u32 b;

	if (!ps)
		return;
	if (now < deadline) {
		ps->early_count++;
		if (deadline - now > ps->early_max_ns)
			ps->early_max_ns = deadline - now;
		return;
	}
	ps->late_sum_ns += now - deadline;
	ps->late_count++;
	if (now - deadline > ps->late_max_ns)
		ps->late_max_ns = now - deadline;
	b = pacer_late_bucket((now - deadline) / 1000);
	barrier_var(b);
	if (b < PACER_LATE_BUCKETS)
		ps->late_hist[b]++;
}

/* pacer_receive: the first call of the consumer's tick program. For a tick it copies the
 * payload to *t, marks the tick delivered (the consumer must request its next tick for
 * whatever is still pending), records its precision and clears the skb's delivery time.
 * Returns enum pacer_rx; the skb is the consumer's to rewrite and send, or to drop. */
static __always_inline int pacer_receive(struct __sk_buff *skb, struct pacer_tick *t)
{
	struct pacer_stats *ps = pacer_stats_get();
	struct pacer_state *st = pacer_state_get();
	struct pacer_tick *f;
	int is_tick;
	__u64 now;

	f = pacer_tick_of(skb, &is_tick);
	if (!is_tick)
		return PACER_RX_CARRIED;
	if (!f) {
		PACER_COUNT(ps, malformed_ticks);
		return PACER_RX_MALFORMED;
	}
	*t = *f;
	now = bpf_ktime_get_ns();
	if (st && __sync_val_compare_and_swap(&st->armed_ns, t->deadline_ns, 0) != t->deadline_ns)
		PACER_COUNT(ps, ticks_stale);
	PACER_COUNT(ps, ticks_delivered);
	pacer_record_precision(ps, now, t->deadline_ns);
	skb->tstamp = 0; /* edt's delivery time is spent; what the consumer sends goes now */
	return PACER_RX_TICK;
}

/* ---- the pacer's programs (inside the pacer namespace) ---- */

static __always_inline int pacer_redirect(__u32 ifindex, struct pacer_stats *ps)
{
	long ret = bpf_redirect(ifindex, 0);

	if (ret != TC_ACT_REDIRECT)
		PACER_COUNT(ps, redirect_errors);
	return ret;
}

/* pacer_tick_ip returns the tick frame's IPv4 header, checksum included. */
static __always_inline struct iphdr pacer_tick_ip(__u32 frame_len)
{
	struct iphdr ip = {
		.version = 4,
		.ihl = 5,
		.tot_len = bpf_htons(frame_len - sizeof(struct ethhdr)),
		.protocol = PACER_IPPROTO,
	};
	__u16 *w = (__u16 *)&ip;
	__u32 sum = 0;

	for (int i = 0; i < (int)(sizeof(ip) / 2); i++)
		sum += w[i];
	ip.check = (__sum16)~csum_fold32(sum);
	return ip;
}

/* pacer_write_tick writes the tick frame's headers and payload over the skb's first bytes. */
static __always_inline int pacer_write_tick(struct __sk_buff *skb, struct pacer_tick *t)
{
	struct ethhdr eth = {
		.h_dest = { 0x02, 'k', 'p', 'a', 'c', 'e' },
		.h_source = { 0x02, 'k', 'p', 'a', 'c', 'e' },
		.h_proto = bpf_htons(ETH_P_IP),
	};
	struct iphdr ip = pacer_tick_ip(skb->len);

	if (bpf_skb_store_bytes(skb, 0, &eth, sizeof(eth), 0) < 0 ||
	    bpf_skb_store_bytes(skb, sizeof(eth), &ip, sizeof(ip), 0) < 0 ||
	    bpf_skb_store_bytes(skb, sizeof(eth) + sizeof(ip), t, sizeof(*t), 0) < 0)
		return -1;
	return 0;
}

/* pacer_build_tick turns a tick request into a tick frame for the earliest armed deadline. */
static __always_inline int pacer_build_tick(struct __sk_buff *skb, struct pacer_stats *ps)
{
	struct pacer_state *st = pacer_state_get();
	struct pacer_tick t = { .magic = PACER_TICK_MAGIC };
	__u64 now = bpf_ktime_get_ns();

	if (!st)
		return TC_ACT_SHOT;
	t.deadline_ns = st->armed_ns;
	if (!t.deadline_ns)
		t.deadline_ns = now; /* delivered meanwhile: this one goes at once, harmlessly */
	t.sent_ns = now;
	t.seq = st->seq;
	if (bpf_skb_change_tail(skb, pacer_cfg.tick_bytes, 0) < 0)
		PACER_COUNT(ps, tick_trim_errors);
	if (pacer_write_tick(skb, &t) < 0) {
		__sync_val_compare_and_swap(&st->armed_ns, t.deadline_ns, 0);
		PACER_COUNT(ps, tick_build_errors);
		return TC_ACT_SHOT;
	}
	if (pacer_cfg.backend == PACER_EDT)
		bpf_skb_set_tstamp(skb, t.deadline_ns, BPF_SKB_TSTAMP_DELIVERY_MONO);
	PACER_COUNT(ps, ticks_entered);
	return pacer_redirect(pacer_cfg.dev_ifindex, ps);
}

/* pacer_enter: TC ingress of both peers. Tick requests (from the tick veth) become tick
 * frames; carried packets (edt: stamped with their deadline) go into the delay device.
 * Which veth a packet came through tells them apart: skb fields such as mark and
 * priority do not survive the veth into another namespace, and the clone's bytes are the
 * consumer's. */
static __always_inline int pacer_enter(struct __sk_buff *skb)
{
	struct pacer_stats *ps = pacer_stats_get();
	__u64 d;

	if (skb->ifindex == pacer_cfg.tick_peer_ifindex)
		return pacer_build_tick(skb, ps);
	if (skb->ifindex != pacer_cfg.peer_ifindex) {
		PACER_COUNT(ps, foreign);
		return TC_ACT_SHOT;
	}
	PACER_COUNT(ps, carried_in);
	if (pacer_cfg.backend == PACER_EDT) {
		d = pacer_carry_deadline(skb);
		if (d) {
			bpf_skb_set_tstamp(skb, d, BPF_SKB_TSTAMP_DELIVERY_MONO);
			PACER_COUNT(ps, edt_set);
		} else {
			PACER_COUNT(ps, edt_no_deadline);
		}
	}
	return pacer_redirect(pacer_cfg.dev_ifindex, ps);
}

/* pacer_filler_of returns the conveyor filler the frame carries, or NULL. */
static __always_inline struct pacer_filler *pacer_filler_of(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct hdr_cursor nh = { .pos = data };
	struct ethhdr *eth;
	struct pacer_filler *f;
	__u8 flags = 0;

	if (parse_ethhdr(&nh, data_end, &eth, &flags) != PACER_FILLER_ETH_P)
		return NULL;
	f = pkt_hdr(data, data_end, nh.pos - data, sizeof(*f));
	if (!f || f->magic != PACER_FILLER_MAGIC)
		return NULL;
	return f;
}

/* The bytes of a filler frame that matter: Ethernet header, magic and stamp. */
#define PACER_FILLER_HEAD (sizeof(struct ethhdr) + sizeof(struct pacer_filler))

/* pacer_piggyback: with fillers in the queue (carry on the conveyor) a tick frame waits a
 * whole period behind them, so every filler pass also looks at the armed deadline and,
 * when it is due and not yet fired, delivers the tick itself: the filler is rewritten into
 * a tick frame, cloned out of the peer and restored. Ticks then have the filler spacing's
 * precision (filler_bytes*8/rate) instead of the period's. */
static __always_inline void pacer_piggyback(struct __sk_buff *skb, struct pacer_stats *ps, __u64 now)
{
	struct pacer_state *st = pacer_state_get();
	struct pacer_tick t = { .magic = PACER_TICK_MAGIC };
	__u8 head[PACER_FILLER_HEAD];
	__u64 armed, fired;

	if (!st)
		return;
	armed = st->armed_ns;
	fired = st->fired_ns;
	if (!armed || fired == armed || !pacer_due(armed, now, 0))
		return;
	if (__sync_val_compare_and_swap(&st->fired_ns, fired, armed) != fired)
		return; /* another CPU's filler fired it */
	t.deadline_ns = armed;
	t.sent_ns = now;
	t.seq = st->seq;
	if (bpf_skb_load_bytes(skb, 0, head, sizeof(head)) < 0 || pacer_write_tick(skb, &t) < 0 ||
	    bpf_clone_redirect(skb, pacer_cfg.peer_ifindex, 0) < 0) {
		st->fired_ns = fired; /* the queued tick frame still serves */
		PACER_COUNT(ps, tick_build_errors);
	} else {
		PACER_COUNT(ps, ticks_piggybacked);
	}
	if (bpf_skb_store_bytes(skb, 0, head, sizeof(head), 0) < 0)
		PACER_COUNT(ps, tick_build_errors); /* the filler is lost at its next pass */
}

/* pacer_filler_pass keeps a conveyor filler going round, unless user space asked for fewer,
 * and records its round trip (the conveyor's calibration). */
static __always_inline int pacer_filler_pass(struct __sk_buff *skb, struct pacer_filler *f,
					     struct pacer_stats *ps)
{
	struct pacer_ctl *ctl;
	__u32 zero = 0;
	__u64 now, period;

	ctl = bpf_map_lookup_elem(&pacer_control, &zero);
	if (ctl && ctl->stop) {
		PACER_COUNT(ps, fillers_dropped);
		return TC_ACT_SHOT;
	}
	if (ctl && ctl->fillers_to_drop > 0) {
		if (__sync_fetch_and_add(&ctl->fillers_to_drop, -1) > 0) {
			PACER_COUNT(ps, fillers_dropped);
			return TC_ACT_SHOT;
		}
		__sync_fetch_and_add(&ctl->fillers_to_drop, 1); /* lost a race: undo */
	}
	now = bpf_ktime_get_ns();
	if (ps) {
		period = now - f->stamp_ns;
		if (f->stamp_ns && period < 10000000000ULL) {
			ps->period_sum_ns += period;
			ps->period_count++;
			if (!ps->period_min_ns || period < ps->period_min_ns)
				ps->period_min_ns = period;
			if (period > ps->period_max_ns)
				ps->period_max_ns = period;
		}
		ps->filler_passes++;
	}
	f->stamp_ns = now;
	pacer_piggyback(skb, ps, now);
	return pacer_redirect(pacer_cfg.dev_ifindex, ps);
}

/* pacer_tick_resize (conveyor without fillers): a tick frame alone in tbf passes once per
 * its own transmission time, so a frame of tick_bytes goes round every Resolution however far
 * its deadline is (10k passes a second at 100 us, each a veth crossing and a softirq). Sized
 * for its next pass to the bytes that take what is left (left_ns at rate_bytes), between
 * PACER_TICK_MIN_BYTES and tick_max_bytes, a far tick takes a few long passes and lands near
 * its deadline in a last short one. A frame that comes back early (tbf's bucket had tokens
 * to spare) is resized again for what is still left. */
static __always_inline void pacer_tick_resize(struct __sk_buff *skb, struct pacer_stats *ps, __u64 left_ns)
{
	__u64 want = left_ns / 1000 * pacer_cfg.rate_bytes / 1000000;

	if (want > pacer_cfg.tick_max_bytes)
		want = pacer_cfg.tick_max_bytes;
	if (want < PACER_TICK_MIN_BYTES)
		want = PACER_TICK_MIN_BYTES;
	if (want != skb->len && bpf_skb_change_tail(skb, want, 0) < 0)
		PACER_COUNT(ps, tick_trim_errors); /* the frame keeps its length: only less precise */
}

/* pacer_pass: TC ingress of dev_end, after a pass through the qdisc. A due tick (or any
 * carried packet) leaves towards the consumer; a tick not yet due goes round again; a tick
 * that is no longer the armed one is dropped (the earlier tick armed after it serves). */
static __always_inline int pacer_pass(struct __sk_buff *skb)
{
	struct pacer_stats *ps = pacer_stats_get();
	struct pacer_state *st;
	struct pacer_filler *fl;
	struct pacer_tick *t;
	int is_tick;
	__u64 now;

	t = pacer_tick_of(skb, &is_tick);
	if (is_tick) {
		if (!t) {
			PACER_COUNT(ps, malformed_ticks);
			return TC_ACT_SHOT;
		}
		st = pacer_state_get();
		if (st && (st->armed_ns != t->deadline_ns || st->fired_ns == t->deadline_ns)) {
			PACER_COUNT(ps, ticks_superseded);
			return TC_ACT_SHOT;
		}
		now = bpf_ktime_get_ns();
		if (pacer_cfg.backend != PACER_EDT && !pacer_due(t->deadline_ns, now, 0)) {
			t->passes++;
			PACER_COUNT(ps, tick_passes);
			if (pacer_cfg.tick_max_bytes)
				pacer_tick_resize(skb, ps, t->deadline_ns - now);
			return pacer_redirect(pacer_cfg.dev_ifindex, ps);
		}
		return pacer_redirect(pacer_cfg.peer_ifindex, ps);
	}
	fl = pacer_filler_of(skb);
	if (fl)
		return pacer_filler_pass(skb, fl, ps);
	PACER_COUNT(ps, carried_out);
	return pacer_redirect(pacer_cfg.peer_ifindex, ps);
}

#endif /* KEDGE_PACER_H */
