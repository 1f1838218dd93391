/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * parse.h - the one place in kedge that does data/data_end arithmetic.
 *
 * Cursor style (after xdp-tools' parsing_helpers.h): each parse_*() takes a cursor and
 * data_end, checks that the whole header lies inside the packet, advances the cursor past
 * it and returns the next protocol (>= 0) or a negative enum parse_err.
 *
 * parse_pkt() runs the whole chain and fills struct pkt with offsets, addresses (IPv4
 * stored v4-mapped in an in6_addr so every map key has one shape) and ports. It works on
 * both XDP (xdp_md) and TC (__sk_buff) packet pointers.
 *
 * Policy, decided here once and covered by fixtures in internal/parsetest:
 *  - VLAN: up to VLAN_MAX_DEPTH (2) stacked 802.1Q/802.1ad tags; more is PARSE_ERR_VLAN_DEPTH.
 *  - IPv4 options: allowed; ihl must be >= 5 and the header must be inside the packet.
 *    tot_len must cover the IP and L4 headers (PARSE_ERR_IP_LEN otherwise). tot_len is not
 *    compared with data_end: in TC the skb may be non-linear, so data_end can end early.
 *  - IPv4/IPv6 fragments: a first fragment is parsed (PKT_F_FRAG set, L4 header present);
 *    a later fragment has no L4 header and is PARSE_ERR_FRAGMENT. Callers pass it untouched.
 *    An IPv6 fragment header with offset 0 and M clear (an "atomic fragment", RFC 6946) is
 *    not a fragment: no PKT_F_FRAG, like IPv4 with MF clear and offset 0.
 *  - IPv6 extension headers: hop-by-hop, routing, destination options, fragment and AH are
 *    walked, at most IPV6_EXT_MAX of them; more is PARSE_ERR_EXT_DEPTH. ESP and "no next
 *    header" end the walk with l4_proto set to that value and no ports. The walk stops at
 *    the fragment header of a later fragment: what follows it is fragment data, not headers
 *    (l4_proto is that header's next header).
 *  - UDP: the header must be inside the packet and inside the IP payload (PARSE_ERR_IP_LEN);
 *    8 <= length <= the IP payload length (first fragments excepted).
 *  - TCP: doff >= 5 and the whole header (options included) inside the packet.
 *  - ICMP/ICMPv6: the 8-byte header (type, code, checksum, id, sequence) inside the packet.
 *    Echo request/reply carry id and sequence in sport/dport; other types leave them 0.
 * Protocols other than TCP/UDP/ICMP/ICMPv6 are PARSE_OK with l4_off set and no ports.
 * parse_tcp_ts() finds the timestamp option among the first TCP_MAX_OPTS options (each NOP
 * counts): Linux, the BSDs and macOS put it within the first six.
 *
 * On error struct pkt keeps what was parsed before the failing check: l3_off once the
 * Ethernet/VLAN headers are in; l3_proto once the ethertype is known; addresses, ttl, tos,
 * payload_len (the IP payload), l4_proto, l4_off and payload_off (= l4_off) once the IP
 * header(s) passed their checks; flags as headers are walked. Ports and the final
 * payload_off/payload_len are written only on PARSE_OK. internal/parsetest pins all of it
 * with a Go reference parser.
 *
 * Offsets in struct pkt turn back into pointers with pkt_hdr(), which bounds them first: the
 * verifier learns nothing from a data_end check on a packet pointer whose variable offset
 * may exceed 0xffff (MAX_PACKET_OFF), so "data + p->l4_off" cannot be checked directly.
 */
#ifndef KEDGE_PARSE_H
#define KEDGE_PARSE_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "proto.h"

#define VLAN_MAX_DEPTH 2
#define IPV6_EXT_MAX 6

/* IPv6 fragment header frag_off field (host order): offset in 8-byte units and the M flag. */
#define IP6_FRAG_OFFSET 0xFFF8
#define IP6_FRAG_MF 0x0001

/* Largest header offset parse_pkt() can produce: 2 VLAN tags, then a 60-byte IPv4 header or
 * a 40-byte IPv6 header and IPV6_EXT_MAX extension headers of at most 2048 bytes each
 * (14 + 8 + 40 + 6 * 2048 = 12350). pkt_hdr() refuses offsets above it. */
#define PKT_OFF_MAX 0x3FFF

enum parse_err {
	PARSE_OK = 0,
	PARSE_ERR_ETH = -1,        /* Ethernet header truncated */
	PARSE_ERR_VLAN = -2,       /* VLAN tag truncated */
	PARSE_ERR_VLAN_DEPTH = -3, /* more than VLAN_MAX_DEPTH tags */
	PARSE_ERR_L3_PROTO = -4,   /* not IPv4/IPv6 */
	PARSE_ERR_IP = -5,         /* IPv4 header truncated or version != 4 */
	PARSE_ERR_IP_IHL = -6,     /* IPv4 ihl < 5 or options beyond the packet */
	PARSE_ERR_IP_LEN = -7,     /* IPv4 tot_len / IPv6 payload_len inconsistent */
	PARSE_ERR_IP6 = -8,        /* IPv6 header truncated or version != 6 */
	PARSE_ERR_EXT = -9,        /* IPv6 extension header truncated */
	PARSE_ERR_EXT_DEPTH = -10, /* more than IPV6_EXT_MAX extension headers */
	PARSE_ERR_FRAGMENT = -11,  /* non-first fragment: no L4 header */
	PARSE_ERR_UDP = -12,       /* UDP header truncated or length < 8 */
	PARSE_ERR_TCP = -13,       /* TCP header truncated */
	PARSE_ERR_TCP_DOFF = -14,  /* TCP doff < 5 or options beyond the packet */
	PARSE_ERR_ICMP = -15,      /* ICMP/ICMPv6 header truncated */
};
#define PARSE_ERR_MAX 16 /* number of slots a per-reason counter array needs */

enum pkt_flags {
	PKT_F_VLAN = 1 << 0,
	PKT_F_FRAG = 1 << 1,     /* first fragment of a fragmented datagram */
	PKT_F_IP_OPTS = 1 << 2,  /* IPv4 options present */
	PKT_F_IP6_EXT = 1 << 3,  /* IPv6 extension headers present */
};

struct hdr_cursor {
	void *pos;
};

/* The result of parse_pkt(). Offsets count from the start of the packet (the Ethernet
 * header). Addresses and ports stay in network byte order. */
struct pkt {
	struct in6_addr saddr; /* IPv4 as ::ffff:a.b.c.d */
	struct in6_addr daddr;
	__be16 sport;          /* TCP/UDP ports; ICMP/ICMPv6 echo: id */
	__be16 dport;          /* ICMP/ICMPv6 echo: sequence */
	__u16 l3_proto;        /* host order: ETH_P_IP or ETH_P_IPV6 */
	__u8 l4_proto;
	__u8 flags;            /* enum pkt_flags */
	__u16 l3_off;
	__u16 l4_off;
	__u16 payload_off;     /* first byte after the L4 header */
	__u16 payload_len;     /* UDP: from its length field; TCP: from the IP length */
	__u8 ttl;              /* IPv4 TTL / IPv6 hop limit */
	__u8 tos;
	__u16 _pad;
};

static __always_inline int parse_ethhdr(struct hdr_cursor *nh, void *data_end,
					struct ethhdr **ethhdr, __u8 *flags)
{
	struct ethhdr *eth = nh->pos;
	__u16 proto;

	if ((void *)(eth + 1) > data_end)
		return PARSE_ERR_ETH;
	nh->pos = eth + 1;
	*ethhdr = eth;
	proto = eth->h_proto;

#pragma unroll
	for (int i = 0; i < VLAN_MAX_DEPTH; i++) {
		struct vlan_hdr *vlh = nh->pos;

		if (proto != bpf_htons(ETH_P_8021Q) && proto != bpf_htons(ETH_P_8021AD))
			return bpf_ntohs(proto);
		if ((void *)(vlh + 1) > data_end)
			return PARSE_ERR_VLAN;
		*flags |= PKT_F_VLAN;
		proto = vlh->h_vlan_encapsulated_proto;
		nh->pos = vlh + 1;
	}
	if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD))
		return PARSE_ERR_VLAN_DEPTH;
	return bpf_ntohs(proto);
}

static __always_inline int parse_iphdr(struct hdr_cursor *nh, void *data_end,
				       struct iphdr **iphdr)
{
	struct iphdr *iph = nh->pos;
	int hdrsize;

	if ((void *)(iph + 1) > data_end || iph->version != 4)
		return PARSE_ERR_IP;
	hdrsize = iph->ihl * 4;
	if (hdrsize < (int)sizeof(*iph))
		return PARSE_ERR_IP_IHL;
	if (nh->pos + hdrsize > data_end)
		return PARSE_ERR_IP_IHL;
	if (bpf_ntohs(iph->tot_len) < hdrsize)
		return PARSE_ERR_IP_LEN;
	nh->pos += hdrsize;
	*iphdr = iph;
	return iph->protocol;
}

/* Walks IPv6 extension headers. Returns the upper-layer protocol or a parse_err.
 * *is_later_frag is set for a fragment with a non-zero offset; the walk ends there. */
static __always_inline int parse_ip6hdr(struct hdr_cursor *nh, void *data_end,
					struct ipv6hdr **ip6hdr, __u8 *flags, __u8 *is_later_frag)
{
	struct ipv6hdr *ip6h = nh->pos;
	__u8 next;

	if ((void *)(ip6h + 1) > data_end || ip6h->version != 6)
		return PARSE_ERR_IP6;
	nh->pos = ip6h + 1;
	*ip6hdr = ip6h;
	next = ip6h->nexthdr;

#pragma unroll
	for (int i = 0; i < IPV6_EXT_MAX; i++) {
		struct ipv6_opt_hdr *opt = nh->pos;

		switch (next) {
		case IPPROTO_HOPOPTS:
		case IPPROTO_ROUTING:
		case IPPROTO_DSTOPTS:
			if ((void *)(opt + 1) > data_end)
				return PARSE_ERR_EXT;
			*flags |= PKT_F_IP6_EXT;
			next = opt->nexthdr;
			nh->pos += (opt->hdrlen + 1) * 8;
			break;
		case IPPROTO_AH:
			if ((void *)(opt + 1) > data_end)
				return PARSE_ERR_EXT;
			*flags |= PKT_F_IP6_EXT;
			next = opt->nexthdr;
			nh->pos += (opt->hdrlen + 2) * 4;
			break;
		case IPPROTO_FRAGMENT: {
			struct frag_hdr *fh = nh->pos;
			__u16 frag_off;

			if ((void *)(fh + 1) > data_end)
				return PARSE_ERR_EXT;
			frag_off = bpf_ntohs(fh->frag_off);
			*flags |= PKT_F_IP6_EXT;
			if (frag_off & (IP6_FRAG_OFFSET | IP6_FRAG_MF))
				*flags |= PKT_F_FRAG; /* not an atomic fragment */
			next = fh->nexthdr;
			nh->pos = fh + 1;
			if (frag_off & IP6_FRAG_OFFSET) {
				/* A later fragment: the rest is data, whatever next says. */
				*is_later_frag = 1;
				return next;
			}
			break;
		}
		default:
			return next;
		}
		if (nh->pos > data_end)
			return PARSE_ERR_EXT;
	}
	switch (next) {
	case IPPROTO_HOPOPTS:
	case IPPROTO_ROUTING:
	case IPPROTO_DSTOPTS:
	case IPPROTO_AH:
	case IPPROTO_FRAGMENT:
		return PARSE_ERR_EXT_DEPTH;
	}
	return next;
}

static __always_inline int parse_udphdr(struct hdr_cursor *nh, void *data_end,
					struct udphdr **udphdr)
{
	struct udphdr *h = nh->pos;

	if ((void *)(h + 1) > data_end)
		return PARSE_ERR_UDP;
	if (bpf_ntohs(h->len) < sizeof(*h))
		return PARSE_ERR_UDP;
	nh->pos = h + 1;
	*udphdr = h;
	return PARSE_OK;
}

static __always_inline int parse_tcphdr(struct hdr_cursor *nh, void *data_end,
					struct tcphdr **tcphdr)
{
	struct tcphdr *h = nh->pos;
	int len;

	if ((void *)(h + 1) > data_end)
		return PARSE_ERR_TCP;
	len = h->doff * 4;
	if (len < (int)sizeof(*h))
		return PARSE_ERR_TCP_DOFF;
	if (nh->pos + len > data_end)
		return PARSE_ERR_TCP_DOFF;
	nh->pos += len;
	*tcphdr = h;
	return PARSE_OK;
}

/* ICMP and ICMPv6 share the 8-byte echo layout: type, code, checksum, id, sequence. */
struct icmp_echo_hdr {
	__u8 type;
	__u8 code;
	__sum16 checksum;
	__be16 id;
	__be16 seq;
};

static __always_inline int parse_icmp_echo(struct hdr_cursor *nh, void *data_end,
					   struct icmp_echo_hdr **icmph)
{
	struct icmp_echo_hdr *h = nh->pos;

	if ((void *)(h + 1) > data_end)
		return PARSE_ERR_ICMP;
	nh->pos = h + 1;
	*icmph = h;
	return PARSE_OK;
}

#define TCP_MAX_OPTS 10

/* Finds the TCP timestamp option. Returns 0 and fills tsval/tsecr (host order) when found,
 * -1 otherwise. The header must already have passed parse_tcphdr() (tcph from pkt_hdr()).
 * Every read is checked against data_end itself: with an "opt_end <= data_end" test up
 * front, clang derives the data_end checks from the opt_end ones and drops them, and the
 * verifier (which cannot) rejects the program. */
static __always_inline int parse_tcp_ts(struct tcphdr *tcph, void *data_end, __u32 *tsval,
					__u32 *tsecr)
{
	__u8 *pos = (__u8 *)(tcph + 1);
	__u8 *opt_end = (__u8 *)tcph + tcph->doff * 4;
	__u8 kind, len;

#pragma unroll
	for (int i = 0; i < TCP_MAX_OPTS; i++) {
		if (pos + 1 > opt_end || (void *)(pos + 1) > data_end)
			return -1;
		kind = *pos;
		if (kind == TCPOPT_EOL)
			return -1;
		if (kind == TCPOPT_NOP) {
			pos++;
			continue;
		}
		if (pos + 2 > opt_end || (void *)(pos + 2) > data_end)
			return -1;
		len = pos[1];
		if (len < 2)
			return -1;
		if (kind == TCPOPT_TIMESTAMP && len == TCPOLEN_TIMESTAMP) {
			if (pos + TCPOLEN_TIMESTAMP > opt_end ||
			    (void *)(pos + TCPOLEN_TIMESTAMP) > data_end)
				return -1;
			*tsval = bpf_ntohl(*(__be32 *)(pos + 2));
			*tsecr = bpf_ntohl(*(__be32 *)(pos + 6));
			return 0;
		}
		pos += len;
	}
	return -1;
}

static __always_inline void ipv4_mapped(struct in6_addr *dst, __be32 addr)
{
	dst->in6_u.u6_addr32[0] = 0;
	dst->in6_u.u6_addr32[1] = 0;
	dst->in6_u.u6_addr32[2] = bpf_htonl(0x0000ffff);
	dst->in6_u.u6_addr32[3] = addr;
}

/* in6_addr_eq compares two addresses as struct pkt holds them (IPv4 v4-mapped). */
static __always_inline int in6_addr_eq(const struct in6_addr *a, const struct in6_addr *b)
{
	return a->in6_u.u6_addr32[0] == b->in6_u.u6_addr32[0] &&
	       a->in6_u.u6_addr32[1] == b->in6_u.u6_addr32[1] &&
	       a->in6_u.u6_addr32[2] == b->in6_u.u6_addr32[2] &&
	       a->in6_u.u6_addr32[3] == b->in6_u.u6_addr32[3];
}

/* pkt_hdr returns a pointer to the len bytes at offset off (from struct pkt) of the packet
 * starting at data, or NULL when they are not all inside it. len must be a constant. */
static __always_inline void *pkt_hdr(void *data, void *data_end, __u32 off, __u32 len)
{
	__u64 o = off;
	void *p;

	/* The verifier must see the bound on the very register added to data. The barrier
	 * makes o opaque, so clang cannot compare one copy of off and add another. */
	barrier_var(o);
	if (o > PKT_OFF_MAX)
		return NULL;
	p = data + o;
	if (p + len > data_end)
		return NULL;
	return p;
}

static __always_inline int is_icmp_echo(__u8 proto, __u8 type)
{
	if (proto == IPPROTO_ICMP)
		return type == ICMP_ECHO || type == ICMP_ECHOREPLY;
	return type == ICMPV6_ECHO_REQUEST || type == ICMPV6_ECHO_REPLY;
}

/* parse_pkt parses Ethernet -> VLAN* -> IPv4/IPv6 (+ext) -> TCP/UDP/ICMP(v6).
 * Returns PARSE_OK or a negative enum parse_err; p holds what was parsed so far. */
static __always_inline int parse_pkt(void *data, void *data_end, struct pkt *p)
{
	struct hdr_cursor nh = { .pos = data };
	struct ethhdr *eth;
	int proto, ret;
	__u8 later_frag = 0;

	__builtin_memset(p, 0, sizeof(*p));
	proto = parse_ethhdr(&nh, data_end, &eth, &p->flags);
	if (proto < 0)
		return proto;
	p->l3_off = nh.pos - data;

	if (proto == ETH_P_IP) {
		struct iphdr *iph;

		p->l3_proto = ETH_P_IP;
		proto = parse_iphdr(&nh, data_end, &iph);
		if (proto < 0)
			return proto;
		if (iph->ihl > 5)
			p->flags |= PKT_F_IP_OPTS;
		ipv4_mapped(&p->saddr, iph->saddr);
		ipv4_mapped(&p->daddr, iph->daddr);
		p->ttl = iph->ttl;
		p->tos = iph->tos;
		p->payload_len = bpf_ntohs(iph->tot_len) - iph->ihl * 4;
		if (iph->frag_off & bpf_htons(IP_MF | IP_OFFSET)) {
			p->flags |= PKT_F_FRAG;
			if (iph->frag_off & bpf_htons(IP_OFFSET))
				later_frag = 1;
		}
	} else if (proto == ETH_P_IPV6) {
		struct ipv6hdr *ip6h;

		p->l3_proto = ETH_P_IPV6;
		proto = parse_ip6hdr(&nh, data_end, &ip6h, &p->flags, &later_frag);
		if (proto < 0)
			return proto;
		/* payload_len counts extension headers too; subtract what we walked. */
		ret = nh.pos - (void *)(ip6h + 1);
		if (bpf_ntohs(ip6h->payload_len) < ret)
			return PARSE_ERR_IP_LEN;
		p->saddr = ip6h->saddr;
		p->daddr = ip6h->daddr;
		p->ttl = ip6h->hop_limit;
		p->tos = (ip6h->priority << 4) | (ip6h->flow_lbl[0] >> 4);
		p->payload_len = bpf_ntohs(ip6h->payload_len) - ret;
	} else {
		return PARSE_ERR_L3_PROTO;
	}

	p->l4_proto = proto;
	p->l4_off = nh.pos - data;
	p->payload_off = p->l4_off;
	if (later_frag)
		return PARSE_ERR_FRAGMENT;

	/* Each L4 header: inside the packet, then inside the IP payload (PARSE_ERR_IP_LEN), then
	 * its own length checks; ports only once all passed. */
	switch (proto) {
	case IPPROTO_UDP: {
		struct udphdr *udph;

		ret = parse_udphdr(&nh, data_end, &udph);
		if (ret < 0)
			return ret;
		if (p->payload_len < sizeof(*udph))
			return PARSE_ERR_IP_LEN;
		/* A first fragment carries only part of the datagram the length describes. */
		if (bpf_ntohs(udph->len) > p->payload_len && !(p->flags & PKT_F_FRAG))
			return PARSE_ERR_UDP;
		p->sport = udph->source;
		p->dport = udph->dest;
		p->payload_len = bpf_ntohs(udph->len) - sizeof(*udph);
		break;
	}
	case IPPROTO_TCP: {
		struct tcphdr *tcph;

		ret = parse_tcphdr(&nh, data_end, &tcph);
		if (ret < 0)
			return ret;
		if (p->payload_len < tcph->doff * 4)
			return PARSE_ERR_IP_LEN;
		p->sport = tcph->source;
		p->dport = tcph->dest;
		p->payload_len -= tcph->doff * 4;
		break;
	}
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6: {
		struct icmp_echo_hdr *icmph;

		ret = parse_icmp_echo(&nh, data_end, &icmph);
		if (ret < 0)
			return ret;
		if (p->payload_len < sizeof(*icmph))
			return PARSE_ERR_IP_LEN;
		if (is_icmp_echo(proto, icmph->type)) {
			p->sport = icmph->id;
			p->dport = icmph->seq;
		}
		p->payload_len -= sizeof(*icmph);
		break;
	}
	default:
		return PARSE_OK;
	}
	p->payload_off = nh.pos - data;
	return PARSE_OK;
}

/* pkt_word reads the len (1..8) bytes at offset off of a TC packet (from skb->data, as
 * bpf_skb_load_bytes counts) into *w as they lie in memory: byte i of the packet is byte i of
 * the word (little-endian objects: its low bytes), the bytes past len zero. When a whole word
 * at off lies in the skb's linear data (always on veth and loopback) it is one load; otherwise
 * (a non-linear skb, or the bytes end less than 8 before data_end) bpf_skb_load_bytes, whose
 * call costs more than the rest of the read. 0, or -1 when the packet is shorter. */
static __always_inline int pkt_word(struct __sk_buff *skb, __u32 off, __u32 len, __u64 *w)
{
	__u64 v = 0, *b;
	__u32 n = len - 1;

	/* 1..8 to every verifier (5.10 and 6.1 lose the range of the callers' checks). */
	barrier_var(n);
	n &= 7;
	b = pkt_hdr((void *)(long)skb->data, (void *)(long)skb->data_end, off, sizeof(v));
	if (b) {
		v = *b;
		if (n < 7)
			v &= (1ULL << (8 * (n + 1))) - 1;
		*w = v;
		return 0;
	}
	if (bpf_skb_load_bytes(skb, off, &v, n + 1) < 0)
		return -1;
	*w = v;
	return 0;
}

#endif /* KEDGE_PARSE_H */
