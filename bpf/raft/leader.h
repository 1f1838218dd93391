/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* leader.h - the lease a Raft leader's user space renews and the state its kernel heartbeat
 * sender keeps (bpf/raft/leader.bpf.c; Go: internal/raft/offload/leader*.go through bpf2go).
 * docs/raft.md "Kernel paths: leader heartbeats" is the specification and the safety argument.
 *
 * raft_lease is written ONLY by user space (memory-mapped: a renewal is a store to memory, not
 * a system call), raft_leader_state ONLY by the kernel. Every field user space stores while
 * the kernel may read it is one aligned word, so no read is torn; fields written together are
 * published by expires_ns (user space zeroes it before it changes the layout, term or
 * addresses, and writes it last). */
#ifndef KEDGE_RAFT_LEADER_H
#define KEDGE_RAFT_LEADER_H

#include "vmlinux.h"
#include "raft.h"

enum raft_leader_consts {
	RAFT_LEADER_FOLLOWERS = 6,        /* a 7-node cluster's followers */
	RAFT_LEADER_MIN_INTERVAL = 100000, /* ns: a lease asking for faster heartbeats is refused */
	/* Ethernet 14 + IPv4 20 + UDP 8 + struct raft_hdr 112 = 154 */
	RAFT_HB_FRAME_LEN = sizeof(struct ethhdr) + sizeof(struct iphdr) + sizeof(struct udphdr) +
			    RAFT_PKT_LEN,
};

/* One follower the kernel heartbeats. Offsets are fixed (Go mirrors them). */
struct raft_follower {
	__u64 id;         /*  0 raft id (the heartbeat's To) */
	__u64 commit;     /*  8 min(Progress.Match, committed) at the last renewal: the heartbeat's Commit */
	__be32 daddr;     /* 16 the follower's raft address (IPv4) */
	__be16 dport;     /* 20 and UDP port */
	__u16 active;     /* 22 1: the kernel sends this follower's heartbeats; 0: user space does */
	__u32 ifindex;    /* 24 egress device (the route to daddr) */
	__u8 dmac[6];     /* 28 next hop's MAC (the neighbour entry user space resolved) */
	__u8 smac[6];     /* 34 the egress device's MAC */
};

/* The lease (array, one slot, BPF_F_MMAPABLE where the kernel has it). */
struct raft_lease {
	__u64 expires_ns;  /*  0 CLOCK_MONOTONIC: the kernel sends while now < expires_ns; 0: not leader */
	__u64 interval_ns; /*  8 heartbeat interval */
	__u64 term;        /* 16 the leader's term */
	__u64 leader;      /* 24 its id (the heartbeat's From) */
	__u64 cluster_id;  /* 32 */
	__be32 saddr;      /* 40 the leader's raft address (the followers check the source) */
	__be16 sport;      /* 44 and port */
	__u16 nfollowers;  /* 46 entries of f[] in use */
	__u64 generation;  /* 48 bumped by user space at every layout change (leadership) */
	struct raft_follower f[RAFT_LEADER_FOLLOWERS]; /* 56 */
	__u32 owner_tgid;  /* 296 the renewing process as the initial pid namespace numbers it (0: no
	                    * owner check): a tick finding it exiting or gone sends nothing and stops */
	__u32 _pad;
};

/* Kernel-written state (array, one slot, mmapable: user space reads it to see the sender run). */
struct raft_leader_state {
	__u64 last_sent_ns; /* when the last round of heartbeats went out */
	__u64 next_ns;      /* when the next round is due (the tick requested for it) */
	__u64 rounds;       /* rounds sent */
	__u64 stopped_ns;   /* when a tick found the lease expired or absent (the sender stopped) */
	__u64 sent[RAFT_LEADER_FOLLOWERS]; /* heartbeats sent per follower slot */
};

/* Per-CPU counters: every tick is accounted as exactly one of ticks_{sent,early,expired,
 * no_lease,bad_lease,owner_exiting}; carried and rx_malformed frames are not ticks. */
struct raft_leader_stats {
	__u64 ticks;          /* ticks received */
	__u64 ticks_sent;     /* ticks that sent a round */
	__u64 ticks_early;    /* ticks with nothing due (stale, or armed by user space): re-requested */
	__u64 ticks_expired;  /* lease expired: nothing sent, no next tick (the sender stops) */
	__u64 ticks_no_lease; /* expires_ns = 0 (not leader): stops */
	__u64 ticks_bad_lease; /* interval below RAFT_LEADER_MIN_INTERVAL or too many followers: stops */
	__u64 ticks_owner_exiting; /* the lease's owner process is exiting (killed) or gone: stops */
	__u64 heartbeats;     /* heartbeats sent (one clone each) */
	__u64 inactive;       /* follower slots skipped (not active: user space heartbeats them) */
	__u64 send_errors;    /* writing or cloning a heartbeat failed: that one is lost */
	__u64 rearmed;        /* pacer_request armed the next tick */
	__u64 rearm_coalesced; /* the next tick was already armed */
	__u64 rearm_errors;   /* pacer_request failed: the sender stops until user space re-arms */
	__u64 carried;        /* carried packets at the tick program (none expected): dropped */
	__u64 rx_malformed;   /* malformed tick frames: dropped */
};

#endif /* KEDGE_RAFT_LEADER_H */
