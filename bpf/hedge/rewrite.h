/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* rewrite.h - the packets the hedger writes: a datagram's address and port rewritten in place
 * with incremental checksum updates (a clone's destination, its hedge; a response's source,
 * to the address the client used), and a stored request rebuilt whole into an skb with full
 * checksums (a hedge from a pacer tick). */
#ifndef KEDGE_HEDGE_REWRITE_H
#define KEDGE_HEDGE_REWRITE_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "csum.h"
#include "parse.h"
#include "hedge.h"
#include "maps.h"

/* rewrite_addr replaces the 16-byte (IPv6) or 4-byte (IPv4) destination (is_dst) or source
 * address and port, keeping IP and UDP checksums right whatever the skb's checksum state
 * (the helpers handle CHECKSUM_PARTIAL/COMPLETE/NONE).
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

/* A cell's UDP payload is summed in chunks of bpf_csum_diff's largest size; the cell's data
 * has room for the last chunk's whole words past the payload (hedge.h: STORE_BYTES + 64). */
#define CSUM_CHUNK 512
#define PAYLOAD_SUM_CHUNKS 4
#define PAYLOAD_SUM_OFF_MAX (sizeof(struct ipv6hdr) + sizeof(struct udphdr) + (PAYLOAD_SUM_CHUNKS - 1) * CSUM_CHUNK)

/* payload_sum: the one's-complement sum of a cell's UDP payload (zero-padded to whole words),
 * chunk by chunk. Negative on error. */
static __always_inline __s64 payload_sum(struct hstore *c, __u32 l3)
{
	__u32 off = l3 + sizeof(struct udphdr), end = (c->len + 3) & ~3U, o, n;
	__s64 sum = 0;

	for (int i = 0; i < PAYLOAD_SUM_CHUNKS; i++) {
		o = off + i * CSUM_CHUNK;
		if (o >= end)
			break;
		n = end - o;
		if (n > CSUM_CHUNK)
			n = CSUM_CHUNK;
		barrier_var(o);
		barrier_var(n);
		/* o <= PAYLOAD_SUM_OFF_MAX and n <= CSUM_CHUNK: inside data[STORE_BYTES + 64]. */
		if (o > PAYLOAD_SUM_OFF_MAX || n > CSUM_CHUNK || n < 4)
			return -1;
		sum = bpf_csum_diff(NULL, 0, (__be32 *)(c->data + o), n, (__wsum)sum);
		if (sum < 0)
			return sum;
	}
	return sum;
}

/* hedge_headers writes c's IP and UDP headers to destination to, with the IPv4 header
 * checksum and a full UDP checksum (the stored bytes' checksum may be partial: a local
 * socket's datagram at TC egress is CHECKSUM_PARTIAL). psum is the payload's sum; the
 * payload is in the skb already. */
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

		__builtin_memcpy(&h, c->data, sizeof(h));
		h.ip.daddr = to->addr.in6_u.u6_addr32[3];
		h.ip.tot_len = bpf_htons(plen);
		csum_ipv4_set(&h.ip);
		h.udp.dest = to->port;
		h.udp.len = bpf_htons(plen - sizeof(h.ip));
		h.udp.check = 0;
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&h.udp, sizeof(h.udp), (__wsum)psum);
		if (sum < 0)
			return -1;
		h.udp.check = csum_udp_final((__u64)sum + csum_pseudo4(h.ip.saddr, h.ip.daddr, IPPROTO_UDP,
								       plen - sizeof(h.ip)));
		return bpf_skb_store_bytes(skb, sizeof(struct ethhdr), &h, sizeof(h), 0) < 0 ? -1 : 0;
	} else {
		struct {
			struct ipv6hdr ip;
			struct udphdr udp;
		} h;

		__builtin_memcpy(&h, c->data, sizeof(h));
		h.ip.daddr = to->addr;
		h.ip.payload_len = bpf_htons(plen - sizeof(h.ip));
		h.udp.dest = to->port;
		h.udp.len = h.ip.payload_len;
		h.udp.check = 0;
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&h.udp, sizeof(h.udp), (__wsum)psum);
		if (sum < 0)
			return -1;
		h.udp.check = csum_udp_final((__u64)sum + csum_pseudo6(&h.ip.saddr, &h.ip.daddr, IPPROTO_UDP,
								       plen - sizeof(h.ip)));
		return bpf_skb_store_bytes(skb, sizeof(struct ethhdr), &h, sizeof(h), 0) < 0 ? -1 : 0;
	}
}

/* hedge_build rewrites the skb (a tick's) into the hedge of cell c to replica to: Ethernet
 * (no addresses: bpf_redirect_neigh fills them in), IP, UDP, payload. 0 or -1. */
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
	if (bpf_skb_change_tail(skb, sizeof(eth) + len, 0) < 0 ||
	    bpf_skb_store_bytes(skb, sizeof(eth), c->data, store_len(len), 0) < 0 ||
	    hedge_headers(skb, c, to, psum) < 0)
		return -1;
	eth.h_proto = bpf_htons(proto);
	return bpf_skb_store_bytes(skb, 0, &eth, sizeof(eth), 0) < 0 ? -1 : 0;
}

#endif /* KEDGE_HEDGE_REWRITE_H */
