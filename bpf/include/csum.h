/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* csum.h - incremental Internet checksum updates (RFC 1624).
 *
 * TC programs rewrite packets with bpf_l3_csum_replace()/bpf_l4_csum_replace(), which also
 * keep skb->csum consistent for CHECKSUM_COMPLETE and leave CHECKSUM_PARTIAL alone; the
 * wrappers below only compute the offsets. XDP programs have no such helpers and use the
 * pure functions on the header in place. */
#ifndef KEDGE_CSUM_H
#define KEDGE_CSUM_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

static __always_inline __u16 csum_fold32(__u32 csum)
{
	csum = (csum & 0xffff) + (csum >> 16);
	csum = (csum & 0xffff) + (csum >> 16);
	return (__u16)csum;
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

/* UDP over IPv4 writes 0 for "no checksum"; a computed 0 is sent as 0xffff (RFC 768). */
static __always_inline __sum16 udp_csum_mangled(__sum16 check)
{
	return check ? check : (__sum16)0xffff;
}

/* For skb rewrites: BPF_F_MARK_MANGLED_0 keeps a UDP checksum of 0 ("none") as 0 and turns a
 * computed 0 into 0xffff; BPF_F_PSEUDO_HDR marks fields covered by the pseudo header. */
#define L4_CSUM_ADDR_FLAGS(is_udp) (BPF_F_PSEUDO_HDR | ((is_udp) ? BPF_F_MARK_MANGLED_0 : 0))

#endif /* KEDGE_CSUM_H */
