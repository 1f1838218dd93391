/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* pacer.h - the contract of kedge's in-kernel pacer: the types and constants its programs
 * (bpf/pacer/pacer.bpf.c), its consumers (through bpf/include/pacer_client.h) and user space
 * (internal/pacer, through bpf2go, once) share. docs/pacer.md has the interface.
 *
 * The pacer gives a consumer's BPF code a packet context (an skb it may rewrite, redirect and
 * clone) at times it chooses: a tick at a requested deadline, and packets it carries until
 * their deadline. Types only: no maps, no code. */
#ifndef KEDGE_PACER_H
#define KEDGE_PACER_H

#include "vmlinux.h"
#include "proto.h"

enum pacer_backend {
	PACER_CONVEYOR = 0, /* tbf: the tick frame (or the filler queue) paces the passes */
	PACER_NETEM = 1,    /* netem: a fixed delay per pass */
	PACER_EDT = 2,      /* fq: skb->tstamp = deadline, one pass */
};

/* Frames of the pacer. An enum so bpf2go carries them to Go. */
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

/* The run's constants, set by internal/pacer before load: in the pacer's own object and, the
 * same values, in each consumer's (Pacer.Client().Bind). */
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

/* Shared state (array, one slot): the pacer's, shared with its consumers. */
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

/* Counters (per-CPU, one slot): the pacer's, shared with its consumers (their calls count
 * here too). Each counts one thing. */
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
	__u64 edt_set;          /* edt: a carried packet stamped with its deadline (pacer_carry,
				 * pacer_recirculate) */
	__u64 edt_no_deadline;  /* edt: carried without a deadline (none given, or the stamp
				 * refused): one pass at once */
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

#endif /* KEDGE_PACER_H */
