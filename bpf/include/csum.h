/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* csum.h - Internet checksums (RFC 1071) for every kedge program that builds or rewrites
 * packets.
 *
 * Built from scratch (a header on the stack, a frame turned around):
 *   IPv4 header        csum_ipv4_set(ip)                       (a 20-byte header, no options)
 *   UDP over IPv4/6    csum_udp_final(sum of the UDP header with check 0 and the payload,
 *                      e.g. bpf_csum_diff(NULL, 0, ...), + csum_pseudo4() or csum_pseudo6())
 * Rewritten in place (RFC 1624):
 *   XDP, stack copies  csum_replace2/4 (one 16/32-bit word), csum_replace_diff (the
 *                      bpf_csum_diff of the bytes that changed)
 *   TC (skbs)          bpf_l3_csum_replace()/bpf_l4_csum_replace() with L4_CSUM_ADDR_FLAGS:
 *                      they also keep skb->csum consistent for CHECKSUM_COMPLETE and leave
 *                      CHECKSUM_PARTIAL alone
 *
 * Sums are one's-complement sums of the bytes as they lie in memory (network order),
 * accumulated in 32 or 64 bits and folded at the end; the byte order of the host does not
 * matter as long as every addend is read from, or written like, packet memory. A UDP
 * checksum from scratch must cover the final bytes: a packet a local socket sent may hold a
 * CHECKSUM_PARTIAL pseudo-header sum in its check field, which is never patched. */
#ifndef KEDGE_CSUM_H
#define KEDGE_CSUM_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* csum_fold32 folds a 32-bit partial sum into 16 bits (not complemented). */
static __always_inline __u16 csum_fold32(__u32 csum)
{
	csum = (csum & 0xffff) + (csum >> 16);
	csum = (csum & 0xffff) + (csum >> 16);
	return (__u16)csum;
}

/* csum_fold64 folds a 64-bit accumulator into a 32-bit partial sum (end-around carry), the
 * form bpf_csum_diff() takes as its seed. */
static __always_inline __u32 csum_fold64(__u64 sum)
{
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffffffff) + (sum >> 32);
	return (__u32)sum;
}

/* Returns the checksum field after replacing 32-bit word 'from' by 'to' (RFC 1624 eq. 3). */
static __always_inline __sum16 csum_replace4(__sum16 check, __be32 from, __be32 to)
{
	__u32 sum = (__u16)~check;

	sum += (__u16)~from + (__u16)(~from >> 16);
	sum += (__u16)to + (__u16)(to >> 16);
	return (__sum16)~csum_fold32(sum);
}

static __always_inline __sum16 csum_replace2(__sum16 check, __be16 from, __be16 to)
{
	__u32 sum = (__u16)~check;

	sum += (__u16)~from;
	sum += (__u16)to;
	return (__sum16)~csum_fold32(sum);
}

/* csum_replace_diff returns the checksum field after a change whose difference is diff:
 * bpf_csum_diff(old bytes, n, new bytes, n, 0) (RFC 1624 eq. 3 for n bytes at once). */
static __always_inline __sum16 csum_replace_diff(__sum16 check, __u32 diff)
{
	return (__sum16)~csum_fold32(csum_fold64((__u64)(__u16)~check + diff));
}

/* UDP over IPv4 writes 0 for "no checksum"; a computed 0 is sent as 0xffff (RFC 768). */
static __always_inline __sum16 udp_csum_mangled(__sum16 check)
{
	return check ? check : (__sum16)0xffff;
}

/* csum_ipv4_set writes the header checksum of an IPv4 header without options (ihl 5) that a
 * program built. */
static __always_inline void csum_ipv4_set(struct iphdr *ip)
{
	__u16 *w = (__u16 *)ip;
	__u32 sum = 0;

	ip->check = 0;
#pragma unroll
	for (int i = 0; i < (int)(sizeof(*ip) / 2); i++)
		sum += w[i];
	ip->check = (__sum16)~csum_fold32(sum);
}

/* csum_pseudo4 is the sum of the IPv4 pseudo header (RFC 768): addresses, protocol and the
 * upper-layer length len (host order). Add it to the sum of the L4 header and payload. */
static __always_inline __u32 csum_pseudo4(__be32 saddr, __be32 daddr, __u8 proto, __u16 len)
{
	return csum_fold64((__u64)saddr + daddr + bpf_htons((__u16)proto) + bpf_htons(len));
}

/* csum_pseudo6 is the sum of the IPv6 pseudo header (RFC 8200 section 8.1): addresses, the
 * upper-layer length len (host order) and the next header. */
static __always_inline __u32 csum_pseudo6(const struct in6_addr *saddr, const struct in6_addr *daddr,
					  __u8 proto, __u32 len)
{
	__u64 sum = (__u64)bpf_htonl(len) + bpf_htonl((__u32)proto);

#pragma unroll
	for (int i = 0; i < 4; i++)
		sum += (__u64)saddr->in6_u.u6_addr32[i] + daddr->in6_u.u6_addr32[i];
	return csum_fold64(sum);
}

/* csum_udp_final turns the sum of a whole UDP datagram - pseudo header, UDP header with
 * check 0, payload - into its checksum field; a computed 0 is sent as 0xffff (RFC 768,
 * RFC 8200: over IPv6 a UDP checksum is never 0). */
static __always_inline __sum16 csum_udp_final(__u64 sum)
{
	return udp_csum_mangled((__sum16)~csum_fold32(csum_fold64(sum)));
}

/* For skb rewrites: BPF_F_MARK_MANGLED_0 keeps a UDP checksum of 0 ("none") as 0 and turns a
 * computed 0 into 0xffff; BPF_F_PSEUDO_HDR marks fields covered by the pseudo header. */
#define L4_CSUM_ADDR_FLAGS(is_udp) (BPF_F_PSEUDO_HDR | ((is_udp) ? BPF_F_MARK_MANGLED_0 : 0))

#endif /* KEDGE_CSUM_H */
