/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* maps.h - the follower XDP program's maps (bpf/raft/raftxdp.bpf.c). Go mirrors the structs
 * through bpf2go (internal/raft/offload). docs/raft.md "Kernel paths: follower".
 *
 * Nothing here is durable: every value is either mirrored from user space AFTER the node's
 * HardState is fsynced (raftx_state) or a record of packets seen (raftx_hb, raftx_stats),
 * and all of it dies with the process (no pins). */
#ifndef KEDGE_RAFT_MAPS_H
#define KEDGE_RAFT_MAPS_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

/* The follower program's configuration: set by user space before load (const volatile
 * raftx_cfg, raftxdp.bpf.c; internal/raft/offload fills it through the generated type). */
struct raftx_config {
	__u64 cluster_id; /* host order */
	__u64 self;       /* this node's raft id */
	/* The pass mark ({0, 0}: none): two little-endian halves of 16 random bytes user space
	 * draws at load (raftxdp.bpf.c, mark()). */
	__u64 mark[2];
	__u16 port;       /* the raft UDP port, host order */
	__u16 _pad[3];
};

/* Slots of raftx_stats.drop: one per enum raft_drop value (rafta's auth adds MAC/replay
 * reasons; RAFT_DROP_MAX stays below this). */
#define RAFTX_DROP_SLOTS 16

/* The node's mirrored state, written by user space with BPF_F_LOCK (one writer: the node's
 * ready loop), read by XDP under the lock so term, leader and its address are one snapshot. */
struct raftx_state {
	struct bpf_spin_lock lock;
	__u32 _pad;
	__u64 term;               /* durable current term (HardState.Term after fsync) */
	__u64 leader;             /* leader of that term as etcd-raft knows it; 0 = none */
	struct in6_addr leader_addr; /* its raft address, IPv4 v4-mapped */
	__be16 leader_port;
	__u16 _pad2[3];
	__u64 alive_until_ns;     /* CLOCK_MONOTONIC; past it nothing is answered in XDP */
	__u64 detect_ns;          /* the election timeout: failure detector (0 = off) and pre-vote lease */
	__u64 detect_jitter_ns;   /* plus uniform [0, jitter) per arming (etcd-raft's randomized timeout) */
	__u64 last_index;         /* last index of the fsynced log (pre-votes, prevote.h) */
	__u64 last_term;          /* its term */
	__u64 detect_after_ns;    /* the failure detector's timeout for this leader (0: detect_ns);
				   * the pre-vote lease stays detect_ns */
	__u64 pending_term;       /* a term user space has taken but not yet fsynced (0: none):
				   * pre-votes up to it go to user space (prevote.h) */
};

/* The last heartbeat of the mirrored leader at the mirrored term seen in XDP: answered, or
 * passed up because the alive deadline was past (then only leader, term and last_ns move).
 * User space reads it with BPF_F_LOCK. */
struct raftx_hb {
	struct bpf_spin_lock lock;
	__u32 _pad;
	__u64 leader;  /* sender (the mirrored leader) */
	__u64 term;    /* its term (= the mirrored term) */
	__u64 commit;  /* highest Commit answered from this leader in this term */
	__u64 last_ns; /* arrival, bpf_ktime_get_ns() (answered or not) */
	__u64 count;   /* heartbeats answered since load */
	__u64 answered_ns; /* arrival of the last one answered */
};

/* User space's last word from a leader: CLOCK_MONOTONIC ns of the last MsgApp, MsgHeartbeat
 * or MsgSnap the node stepped into etcd-raft (each resets its CheckQuorum lease), over UDP or
 * TCP. Written by user space only - a 64-bit store into the memory-mapped array (BPF_F_MMAPABLE,
 * a map update where the kernel refuses that) that only moves forward - and read by prevote.h
 * for the pre-vote lease beside follower_hb (docs/raft.md section 13, "The leader's last word"). */
struct raftx_word {
	__u64 last_ns;
};

/* While this node leads: the last heartbeat response of each follower (key: its id, host
 * order), recorded in XDP and passed up as before. The node steps it into etcd-raft when its
 * transport has not delivered it (a starved receiving goroutine), so that CheckQuorum sees
 * followers that did answer (docs/raft.md section 14, "CheckQuorum under starvation"). */
struct raftx_ack {
	__u64 term;    /* the term it answered: the leader's mirrored term */
	__u64 last_ns; /* arrival, bpf_ktime_get_ns() */
	__u64 count;   /* responses recorded from this follower */
};
#define RAFTX_MAX_PEERS 64

/* While this node leads: the quorum wait (docs/raft.md "Electrode: broadcast and quorum
 * wait"). User space writes the voters other than this node from etcd-raft's configuration
 * (id; n = 0 turns the wait off: a joint configuration, or this node not a voter); the program
 * keeps, per voter, the highest index it acknowledged in a MsgAppResp at `term` and absorbs
 * (XDP_DROP) a response that can move neither that voter's match nor the commit index:
 * with the leader's own acknowledgement, k = (n + 1) / 2 voters make a quorum, so a
 * response for index i moves the commit only if fewer than k other voters acknowledged i.
 * The node steps one MsgAppResp per voter with what was absorbed at its next tick. */
#define RAFTX_QUORUM_MAX 16
struct raftx_voter {
	__u64 id;       /* node id, host order */
	__u64 index;    /* highest index acknowledged at term (0: none) */
	__u64 count;    /* MsgAppResp recorded at term, passed or absorbed */
	__u64 absorbed; /* of them absorbed: the node steps the record when this moved */
};
struct raftx_quorum {
	struct bpf_spin_lock lock;
	__u32 n;    /* voters in v[] */
	__u64 term; /* the term v[].index/count/absorbed were recorded at (another: reset) */
	struct raftx_voter v[RAFTX_QUORUM_MAX];
};

/* The failure detector: one bpf_timer, re-armed by every answered heartbeat. */
struct raftx_detect {
	struct bpf_timer timer;
	__u64 leader;
	__u64 term;
	__u64 last_ns;
	__u64 expires_ns; /* last_ns + the timeout of this arming */
	__u32 inited;
	__u32 _pad;
};

enum raftx_event_type {
	RAFTX_EV_LEADER_SILENT = 1, /* no heartbeat from leader for detect_ns (+ jitter) */
};

/* Ring buffer record: wakes the node to start a pre-vote. */
struct raftx_event {
	__u32 type; /* enum raftx_event_type */
	__u32 _pad;
	__u64 leader;
	__u64 term;
	__u64 last_ns; /* arrival of the last heartbeat seen (raftx_hb.last_ns) */
	__u64 now_ns;  /* when the timer fired */
};

/* Per-CPU counters: every packet the program sees lands in exactly one of not_raft, drop[],
 * hb_*, pv_*, ack_recorded, app_recorded, app_absorbed, passed_type, sign_failed or
 * reflect_failed; detect_* count timer events. */
struct raftx_stats {
	__u64 not_raft;          /* not UDP to the raft port, or not parseable: passed untouched */
	__u64 rx;                /* raft packets looked at (sum of the rest but not_raft) */
	__u64 drop[RAFTX_DROP_SLOTS]; /* refused by raft_hdr_check/raft_auth: XDP_DROP */
	__u64 hb_answered;       /* MsgHeartbeatResp built in place: XDP_TX */
	__u64 hb_no_state;       /* the node has not mirrored its state yet: passed */
	__u64 hb_not_alive;      /* a valid heartbeat, alive_until_ns past: recorded (last_ns), detector
				  * re-armed, passed (user space may be dead) */
	__u64 hb_stale_term;     /* term below the mirrored term: passed */
	__u64 hb_new_term;       /* term above it: passed (a term change must be fsynced first) */
	__u64 hb_leader;         /* sender is not the mirrored leader (or none is known): passed */
	__u64 hb_leader_addr;    /* the leader's id from another address/port: passed */
	__u64 pv_answered;       /* raft_prevote built the answer: XDP_TX */
	__u64 pv_passed;         /* raft_prevote left it to user space */
	__u64 pv_dropped;        /* raft_prevote: a leader heard within the election timeout (etcd-raft ignores it) */
	__u64 passed_type;       /* every other raft message: user space's */
	__u64 sign_failed;       /* raft_sign refused (no auth config): XDP_ABORTED */
	__u64 reflect_failed;    /* a header was not where parse_pkt said: XDP_ABORTED */
	__u64 detect_armed;      /* timer (re)started by a heartbeat */
	__u64 detect_fired;      /* timer expired: event written */
	__u64 detect_rearmed;    /* expired while a heartbeat re-armed it on another CPU: no event */
	__u64 detect_ringbuf_full; /* timer expired but the ring buffer was full */
	__u64 detect_init_failed;  /* bpf_timer_init/set_callback failed: no detection */
	__u64 ack_recorded;      /* MsgHeartbeatResp at the term this node leads: recorded, passed */
	__u64 ack_full;          /* ... but leader_acks had no room for its sender: passed */
	__u64 marked;            /* passed up with the pass mark in place of its verified MAC */
	__u64 app_recorded;      /* MsgAppResp of a voter at the term this node leads: recorded, passed */
	__u64 app_absorbed;      /* ... recorded and absorbed by the quorum wait: XDP_DROP */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct raftx_state);
} follower_state SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct raftx_hb);
} follower_hb SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct raftx_detect);
} follower_timer SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct raftx_word);
} follower_word SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RAFTX_MAX_PEERS);
	__type(key, __u64);
	__type(value, struct raftx_ack);
} leader_acks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct raftx_quorum);
} leader_quorum SEC(".maps");

/* One page: a record is 40 bytes, the detector writes at most one per election timeout, and
 * the node reads each as it comes (a full ring is counted: detect_ringbuf_full). */
#define RAFTX_EVENTS_BYTES 4096

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, RAFTX_EVENTS_BYTES);
} follower_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct raftx_stats);
} follower_stats SEC(".maps");

#endif /* KEDGE_RAFT_MAPS_H */
