/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* auth.h - authentication of kedge raft's UDP packets in XDP (docs/raft.md, "Kernel paths:
 * pre-vote and authentication", is the specification; this comment is its summary).
 *
 * Every Raft packet is checked, after raft_hdr_check(), by raft_auth():
 *   1. cluster id: the header's cluster_id equals the configured one (RAFT_DROP_CLUSTER);
 *   2. allowlist: `from` is a configured peer AND the packet's IP source address and UDP
 *      source port are that peer's raft address (RAFT_DROP_PEER);
 *   3. with a cluster key set: RAFT_F_MAC is set and mac = SipHash-2-4-128(key, bytes 0..95
 *      of the UDP payload) - every header byte but the MAC itself, so cluster_id, from, to,
 *      type, term, indexes, ctx and auth_seq are all covered (RAFT_DROP_MAC);
 *      without a key: RAFT_F_MAC clear, auth_seq and mac zero (RAFT_DROP_FLAGS);
 *   4. with a key: auth_seq inside the sender's replay window (RAFT_DROP_STALE: 64 or more
 *      below the highest seen; RAFT_DROP_REPLAY: seen before). The window moves only for a
 *      packet whose MAC passed.
 *
 * auth_seq: bit 63 says which of a node's two senders drew it (0 = user space, 1 = the
 * kernel: XDP replies, kernel-sent heartbeats), bits 0-62 a per-sender counter that starts
 * at the sender's CLOCK_REALTIME in ns when it starts and counts up by one per packet (so a
 * restarted sender starts above everything it sent before, as long as it sends fewer than
 * one packet per ns and the wall clock is not stepped back past its own downtime). Each
 * receiver keeps one RFC 4303-style window (highest seq + 64-bit bitmap) per peer and
 * sender, so reordering of up to 63 packets between one sender's packets is accepted.
 *
 * raft_sign() signs a header the kernel built (XDP_TX replies, kernel heartbeats) on the
 * kernel channel; user space signs its own sends (internal/raft/wire.Signer).
 *
 * The maps below are part of every program that includes this header; user space fills
 * raft_auth_cfg, raft_peers and raft_tx_seq (internal/raft/wire.FillAuthMaps) before the
 * program is attached. Little-endian BPF target only (siphash.h).
 */
#ifndef KEDGE_RAFT_AUTH_H
#define KEDGE_RAFT_AUTH_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "parse.h"
#include "raft.h"
#include "siphash.h"

#define RAFT_SEQ_KERNEL (1ULL << 63) /* auth_seq drawn by a kernel sender */
#define RAFT_REPLAY_WINDOW 64
#define RAFT_PEERS_MAX 16
/* The MAC covers the UDP payload up to the mac field: bytes 0..95. */
#define RAFT_MAC_COVER 96
_Static_assert(RAFT_MAC_COVER == __builtin_offsetof(struct raft_hdr, mac), "MAC covers all but itself");
_Static_assert(RAFT_MAC_COVER % 8 == 0, "whole SipHash words");

struct raft_auth_config {
	__u64 cluster_id; /* host order; 0 = not configured: every packet is RAFT_DROP_CLUSTER */
	__u64 k0;         /* SipHash key, bytes 0-7 of the cluster key as a little-endian u64 */
	__u64 k1;         /* bytes 8-15 */
	__u32 key_set;    /* 0: no MAC (cluster id + allowlist only) */
	__u32 _pad;
};

/* One sender's replay window: top = highest auth_seq accepted (low 63 bits), bit i of
 * seen = top - i was accepted. */
struct raft_replay {
	__u64 top;
	__u64 seen;
};

struct raft_peer {
	struct in6_addr addr; /* raft address, IPv4 v4-mapped (::ffff:a.b.c.d) as parse.h stores it */
	__be16 port;          /* raft UDP port, network order */
	__u16 _pad0;
	__u32 _pad1;
	struct bpf_spin_lock lock; /* guards win */
	__u32 _pad2;
	struct raft_replay win[2]; /* [0] the peer's user space, [1] its kernel senders */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct raft_auth_config);
} raft_auth_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, RAFT_PEERS_MAX);
	__type(key, __u64); /* peer id, host order */
	__type(value, struct raft_peer);
} raft_peers SEC(".maps");

/* Next auth_seq of this node's kernel senders (low 63 bits); user space seeds it with
 * CLOCK_REALTIME ns when it loads the program. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} raft_tx_seq SEC(".maps");

/* raft_mac computes SipHash-2-4-128 over bytes 0..RAFT_MAC_COVER-1 of the header. The
 * caller has checked that the whole header lies before data_end. A BPF subprogram, not
 * inlined: a program verifies and signs in several places, and each inlined copy would
 * add its SipHash state to the caller's 512-byte stack. */
static __noinline void raft_mac(const struct raft_hdr *h, __u64 k0, __u64 k1, __u64 out[2])
{
	struct siphash_state s;
	__u64 m;

	siphash_init(&s, k0, k1, 1);
	/* A loop, not unrolled: unrolled, the twelve compressions spill the SipHash state
	 * around the 10 BPF registers and the frame grows to ~250 bytes. */
#pragma clang loop unroll(disable)
	for (int i = 0; i < RAFT_MAC_COVER / 8; i++) {
		__builtin_memcpy(&m, (const __u8 *)h + 8 * i, 8);
		siphash_word(&s, m);
	}
	siphash_final(&s, siphash_tail_word(0, RAFT_MAC_COVER), 1, out);
}

/* raft_replay_check moves the window of seq's sender and says whether seq is new. */
static __always_inline int raft_replay_check(struct raft_peer *peer, __u64 seq)
{
	struct raft_replay *w = (seq & RAFT_SEQ_KERNEL) ? &peer->win[1] : &peer->win[0];
	int ret = RAFT_OK;
	__u64 d;

	seq &= ~RAFT_SEQ_KERNEL;
	if (!seq)
		return RAFT_DROP_STALE; /* never sent: counters start at the wall clock */
	bpf_spin_lock(&peer->lock);
	if (seq > w->top) {
		d = seq - w->top;
		w->seen = d >= RAFT_REPLAY_WINDOW ? 1 : (w->seen << d) | 1;
		w->top = seq;
	} else {
		d = w->top - seq;
		if (d >= RAFT_REPLAY_WINDOW)
			ret = RAFT_DROP_STALE;
		else if (w->seen & (1ULL << d))
			ret = RAFT_DROP_REPLAY;
		else
			w->seen |= 1ULL << d;
	}
	bpf_spin_unlock(&peer->lock);
	return ret;
}

/* raft_auth_src is raft_auth() for a caller that has parsed the packet: saddr and sport as
 * struct pkt holds them (v4-mapped address, network-order port). Returns RAFT_OK or an enum
 * raft_drop reason. */
static __always_inline int raft_auth_src(struct raft_hdr *h, void *data_end,
					 const struct in6_addr *saddr, __be16 sport)
{
	struct raft_auth_config *cfg;
	struct raft_peer *peer;
	__u64 mac[2], got0, got1, from;
	__u32 zero = 0;

	if ((void *)(h + 1) > data_end)
		return RAFT_DROP_SHORT;
	cfg = bpf_map_lookup_elem(&raft_auth_cfg, &zero);
	if (!cfg || !cfg->cluster_id || bpf_be64_to_cpu(h->cluster_id) != cfg->cluster_id)
		return RAFT_DROP_CLUSTER;
	from = bpf_be64_to_cpu(h->from);
	peer = bpf_map_lookup_elem(&raft_peers, &from);
	if (!peer || peer->port != sport || !in6_addr_eq(&peer->addr, saddr))
		return RAFT_DROP_PEER;
	__builtin_memcpy(&got0, h->mac, 8);
	__builtin_memcpy(&got1, h->mac + 8, 8);
	if (!cfg->key_set) {
		if ((h->flags & RAFT_F_MAC) || h->auth_seq || got0 || got1)
			return RAFT_DROP_FLAGS;
		return RAFT_OK;
	}
	if (!(h->flags & RAFT_F_MAC))
		return RAFT_DROP_MAC;
	raft_mac(h, cfg->k0, cfg->k1, mac);
	if ((got0 ^ mac[0]) | (got1 ^ mac[1]))
		return RAFT_DROP_MAC;
	return raft_replay_check(peer, bpf_be64_to_cpu(h->auth_seq));
}

/* raft_auth is raft_auth_src for a caller that has not kept the parsed packet: it parses it
 * again for its source address and port. */
static __always_inline int raft_auth(struct xdp_md *ctx, struct raft_hdr *h, void *data_end)
{
	void *data = (void *)(long)ctx->data;
	struct pkt p = {};

	if (parse_pkt(data, data_end, &p) != PARSE_OK || p.l4_proto != IPPROTO_UDP)
		return RAFT_DROP_SHORT;
	return raft_auth_src(h, data_end, &p.saddr, p.sport);
}

/* raft_sign signs a header built in the kernel (a reply turned around in place, a
 * kernel-sent heartbeat): with a key, RAFT_F_MAC, the next kernel-channel auth_seq and the
 * MAC; without, the MAC fields cleared. Recompute the UDP checksum afterwards. Returns 0, or
 * -1 when the header is not inside the packet or the maps are missing. */
static __always_inline int raft_sign(struct raft_hdr *h, void *data_end)
{
	struct raft_auth_config *cfg;
	__u64 mac[2], seq, *next;
	__u32 zero = 0;

	if ((void *)(h + 1) > data_end)
		return -1;
	cfg = bpf_map_lookup_elem(&raft_auth_cfg, &zero);
	next = bpf_map_lookup_elem(&raft_tx_seq, &zero);
	if (!cfg || !next)
		return -1;
	if (!cfg->key_set) {
		h->flags &= ~RAFT_F_MAC;
		h->auth_seq = 0;
		__builtin_memset(h->mac, 0, RAFT_MAC_LEN);
		return 0;
	}
	seq = __sync_fetch_and_add(next, 1);
	h->flags |= RAFT_F_MAC;
	h->auth_seq = bpf_cpu_to_be64(seq | RAFT_SEQ_KERNEL);
	raft_mac(h, cfg->k0, cfg->k1, mac);
	__builtin_memcpy(h->mac, &mac[0], 8);
	__builtin_memcpy(h->mac + 8, &mac[1], 8);
	return 0;
}

#endif /* KEDGE_RAFT_AUTH_H */
