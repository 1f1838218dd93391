// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* csumtest: exposes csum.h to BPF_PROG_TEST_RUN for internal/parsetest's tests. Not attached
 * anywhere.
 *
 * csum_xdp takes an Ethernet + IPv4 (no options) or IPv6 (no extension headers) + UDP frame
 * whose checksum fields hold anything, and
 *  1. computes them from scratch, as a program that builds a packet does: csum_ipv4_set()
 *     for the IPv4 header; for UDP the pseudo header (csum_pseudo4 / csum_pseudo6), the UDP
 *     header with check 0 (bpf_csum_diff) and the payload (summed here in 4-byte words),
 *     folded by csum_udp_final();
 *  2. with at least CSUMTEST_CHANGED payload bytes, flips every bit of the first eight and
 *     follows with incremental updates, as a program that rewrites a packet does: bytes 0-3
 *     by csum_replace4(), bytes 4-7 by csum_replace_diff() of their bpf_csum_diff().
 * Returns XDP_TX after both steps, XDP_PASS after the first alone (a shorter payload), and
 * XDP_ABORTED for a frame it does not take. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "csum.h"
#include "parse.h"
#include "proto.h"

#define CSUMTEST_CHANGED 8
/* A frame BPF_PROG_TEST_RUN takes (below a page) holds fewer payload words than this. */
#define CSUMTEST_WORDS_MAX 1024

/* payload_sum adds the bytes from p to data_end as 4-byte words (the last one zero-padded). */
static __always_inline __u64 payload_sum(void *p, void *data_end)
{
	__u64 sum = 0;

	for (int i = 0; i < CSUMTEST_WORDS_MAX; i++) {
		__u32 *w = p;
		__u32 tail = 0;

		if ((void *)(w + 1) <= data_end) {
			sum += *w;
			p = w + 1;
			continue;
		}
		for (int k = 0; k < 3; k++) {
			__u8 *b = (__u8 *)p + k;

			if ((void *)(b + 1) > data_end)
				break;
			((__u8 *)&tail)[k] = *b;
		}
		return sum + tail;
	}
	return sum;
}

SEC("xdp")
int csum_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct udphdr *udp;
	struct pkt p = {};
	__u32 *w, old, diff;
	__s64 sum;

	if (parse_pkt(data, data_end, &p) != PARSE_OK || p.l4_proto != IPPROTO_UDP ||
	    (p.flags & (PKT_F_IP_OPTS | PKT_F_IP6_EXT | PKT_F_FRAG | PKT_F_VLAN)))
		return XDP_ABORTED;
	udp = pkt_hdr(data, data_end, p.l4_off, sizeof(*udp));
	if (!udp)
		return XDP_ABORTED;

	/* 1. From scratch. */
	udp->check = 0;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)udp, sizeof(*udp), 0);
	if (sum < 0)
		return XDP_ABORTED;
	if (p.l3_proto == ETH_P_IP) {
		struct iphdr *ip = pkt_hdr(data, data_end, p.l3_off, sizeof(*ip));

		if (!ip)
			return XDP_ABORTED;
		csum_ipv4_set(ip);
		sum += csum_pseudo4(ip->saddr, ip->daddr, IPPROTO_UDP, bpf_ntohs(udp->len));
	} else {
		struct ipv6hdr *ip6 = pkt_hdr(data, data_end, p.l3_off, sizeof(*ip6));

		if (!ip6)
			return XDP_ABORTED;
		sum += csum_pseudo6(&ip6->saddr, &ip6->daddr, IPPROTO_UDP, bpf_ntohs(udp->len));
	}
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	udp = pkt_hdr(data, data_end, p.l4_off, sizeof(*udp));
	if (!udp)
		return XDP_ABORTED;
	udp->check = csum_udp_final((__u64)sum + payload_sum(udp + 1, data_end));

	/* 2. Incremental. */
	w = (__u32 *)(udp + 1);
	if ((void *)w + CSUMTEST_CHANGED > data_end)
		return XDP_PASS;
	old = w[0];
	w[0] = ~old;
	udp->check = udp_csum_mangled(csum_replace4(udp->check, old, w[0]));
	old = w[1];
	w[1] = ~old;
	diff = (__u32)bpf_csum_diff(&old, sizeof(old), &w[1], sizeof(w[1]), 0);
	udp->check = udp_csum_mangled(csum_replace_diff(udp->check, diff));
	return XDP_TX;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
