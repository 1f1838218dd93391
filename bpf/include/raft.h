/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* raft.h - the wire format of kedge raft's small messages (UDP), shared by the node's Go
 * codec (internal/raft/wire) and, in part 2, the XDP programs that answer heartbeats and
 * pre-votes. docs/raft.md section 3 describes every field and the drop policy.
 *
 * One etcd-raft message without entries, snapshot or long context per UDP datagram; the
 * datagram payload is exactly one struct raft_hdr (RAFT_PKT_LEN bytes, no variable part), so
 * every field sits at a constant offset after the UDP header and a program checks the whole
 * header with one bounds check. All integers are in network byte order.
 *
 * Go mirrors the layout through bpf2go (-type raft_hdr); internal/raft/wire's tests compare
 * the Go codec's offsets with the BTF of this struct and run raft_hdr_check() (through
 * bpf/raft/raftwire.bpf.c and BPF_PROG_TEST_RUN) against the Go decoder's verdict on the
 * same packets.
 */
#ifndef KEDGE_RAFT_H
#define KEDGE_RAFT_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* Constants are enum members so that they reach the object's BTF: internal/raft/wire's
 * codec is written by hand, and its TestLayoutMatchesHeader compares them. */
enum raft_wire {
	RAFT_MAGIC = 0x4b524654, /* "KRFT" */
	RAFT_VERSION = 1,
	RAFT_CTX_MAX = 16,       /* etcd-raft's ReadIndex context on heartbeats: kedge uses 8 bytes */
	RAFT_MAC_LEN = 16,       /* SipHash-2-4-128 over bytes 0..95 (bpf/raft/auth.h) */
	RAFT_PKT_LEN = 112,      /* sizeof(struct raft_hdr): the whole UDP payload */
	/* Bulk (TCP) limits, docs/raft.md: a frame of an append or other message, and a
	 * snapshot. */
	RAFT_BULK_MAX = 8 << 20,
	RAFT_SNAP_MAX = 256 << 20,
};

/* struct raft_hdr.flags */
enum raft_flags {
	RAFT_F_REJECT = 1 << 0, /* Message.Reject */
	RAFT_F_MAC = 1 << 1,    /* mac/auth_seq are set: the cluster has a key (bpf/raft/auth.h) */
	RAFT_F_KNOWN = RAFT_F_REJECT | RAFT_F_MAC,
};

/* etcd-raft raftpb.MessageType numbers of the messages allowed on UDP. */
enum raft_msg_type {
	RAFT_MSG_APP = 3,            /* only without entries: probe / commit update */
	RAFT_MSG_APP_RESP = 4,
	RAFT_MSG_VOTE = 5,
	RAFT_MSG_VOTE_RESP = 6,
	RAFT_MSG_HEARTBEAT = 8,
	RAFT_MSG_HEARTBEAT_RESP = 9,
	RAFT_MSG_TRANSFER_LEADER = 13,
	RAFT_MSG_TIMEOUT_NOW = 14,
	RAFT_MSG_PRE_VOTE = 17,
	RAFT_MSG_PRE_VOTE_RESP = 18,
};

#define RAFT_UDP_TYPES                                                                  \
	((1U << RAFT_MSG_APP) | (1U << RAFT_MSG_APP_RESP) | (1U << RAFT_MSG_VOTE) |         \
	 (1U << RAFT_MSG_VOTE_RESP) | (1U << RAFT_MSG_HEARTBEAT) |                          \
	 (1U << RAFT_MSG_HEARTBEAT_RESP) | (1U << RAFT_MSG_TRANSFER_LEADER) |               \
	 (1U << RAFT_MSG_TIMEOUT_NOW) | (1U << RAFT_MSG_PRE_VOTE) | (1U << RAFT_MSG_PRE_VOTE_RESP))

struct raft_hdr {
	__be32 magic;        /*  0 RAFT_MAGIC */
	__u8 version;        /*  4 RAFT_VERSION */
	__u8 type;           /*  5 enum raft_msg_type */
	__u8 flags;          /*  6 RAFT_F_* */
	__u8 ctx_len;        /*  7 bytes used in ctx, <= RAFT_CTX_MAX */
	__be64 cluster_id;   /*  8 */
	__be64 from;         /* 16 sender node id */
	__be64 to;           /* 24 receiver node id */
	__be64 term;         /* 32 */
	__be64 log_term;     /* 40 */
	__be64 index;        /* 48 */
	__be64 commit;       /* 56 */
	__be64 reject_hint;  /* 64 */
	__u8 ctx[RAFT_CTX_MAX]; /* 72 Message.Context, zero padded */
	__be64 auth_seq;     /* 88 replay window sequence (bit 63: kernel sender); 0 without a key */
	__u8 mac[RAFT_MAC_LEN]; /* 96 MAC over bytes 0..95; 0 without a key */
};

/* Natural alignment leaves no padding: 8 bytes of u8/u32 fields, then u64s and byte arrays
 * at multiples of 8. */
_Static_assert(sizeof(struct raft_hdr) == RAFT_PKT_LEN, "raft_hdr is the whole UDP payload");

/* Why a packet was refused. The Go codec returns the same codes (wire.Reason); the node
 * counts them by name in kedge_raft_transport_dropped_total{reason}. RAFT_DROP_PEER (from is
 * not a configured peer, or not at that peer's address) needs the peer table: the Go side
 * checks it after raft_hdr_check(); the XDP program checks it in a map (bpf/raft/auth.h).
 * RAFT_DROP_MAC, _STALE and _REPLAY come from raft_auth() (auth.h) and the Go verifier. */
enum raft_drop {
	RAFT_OK = 0,
	RAFT_DROP_SHORT = 1,   /* payload shorter than RAFT_PKT_LEN */
	RAFT_DROP_LONG = 2,    /* payload longer than RAFT_PKT_LEN */
	RAFT_DROP_MAGIC = 3,
	RAFT_DROP_VERSION = 4,
	RAFT_DROP_CLUSTER = 5, /* another cluster's packet */
	RAFT_DROP_TO = 6,      /* not addressed to this node */
	RAFT_DROP_PEER = 7,    /* unknown sender or wrong source address */
	RAFT_DROP_TYPE = 8,    /* a message type not allowed on UDP */
	RAFT_DROP_FLAGS = 9,   /* unknown flag bits, or MAC fields set while the cluster has no key */
	RAFT_DROP_CTX = 10,    /* ctx_len > RAFT_CTX_MAX or non-zero bytes past ctx_len */
	RAFT_DROP_MAC = 11,    /* the cluster has a key: MAC missing or wrong */
	RAFT_DROP_STALE = 12,  /* auth_seq below the sender's replay window */
	RAFT_DROP_REPLAY = 13, /* auth_seq seen before */
	RAFT_DROP_MAX = 14,
};

/* raft_hdr_check validates the header that starts at h and ends at or before data_end, with
 * payload_len the UDP payload length (from the UDP header). Everything but the peer table
 * and the authentication fields (RAFT_F_MAC, auth_seq, mac: raft_auth() in auth.h checks
 * them against the cluster's key). cluster_id and self are in host order. */
static __always_inline int raft_hdr_check(struct raft_hdr *h, void *data_end, __u32 payload_len,
					  __u64 cluster_id, __u64 self)
{
	__u8 i;

	if (payload_len < RAFT_PKT_LEN || (void *)(h + 1) > data_end)
		return RAFT_DROP_SHORT;
	if (payload_len > RAFT_PKT_LEN)
		return RAFT_DROP_LONG;
	if (h->magic != bpf_htonl(RAFT_MAGIC))
		return RAFT_DROP_MAGIC;
	if (h->version != RAFT_VERSION)
		return RAFT_DROP_VERSION;
	if (bpf_be64_to_cpu(h->cluster_id) != cluster_id)
		return RAFT_DROP_CLUSTER;
	if (bpf_be64_to_cpu(h->to) != self)
		return RAFT_DROP_TO;
	if (h->type >= 32 || !((1U << h->type) & RAFT_UDP_TYPES))
		return RAFT_DROP_TYPE;
	if (h->flags & ~RAFT_F_KNOWN)
		return RAFT_DROP_FLAGS;
	if (h->ctx_len > RAFT_CTX_MAX)
		return RAFT_DROP_CTX;
#pragma unroll
	for (i = 0; i < RAFT_CTX_MAX; i++)
		if (i >= h->ctx_len && h->ctx[i])
			return RAFT_DROP_CTX;
	return RAFT_OK;
}

#endif /* KEDGE_RAFT_H */
