/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* ident.h - which identifier a packet carries, and which echo.
 *
 * pp_identify() turns a parsed packet into a struct pp_pkt: the packet's own direction with
 * the identifier it carries (pid, valid when the packet is a request), and the reverse
 * direction with the identifier it echoes (reply, valid when it is a reply). A packet can
 * be both (a TCP data segment that also ACKs). A QUIC packet carries no identifier: what it
 * carries (its spin bit, its connection ids) goes to pp->quic and flow.h's pp_quic() keeps
 * the state. Everything that cannot be measured is counted under one skip_* reason. */
#ifndef KEDGE_PPING_IDENT_H
#define KEDGE_PPING_IDENT_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "counters.h"
#include "parse.h"
#include "reqid.h"
#include "pping.h"
#include "maps.h"

#define PP_DNS_PORT 53
#define PP_DNS_HDR_LEN 12
#define PP_DNS_QR 0x8000

/* QUIC's first byte (RFC 9000 section 17): header form, fixed bit, and in short headers the
 * spin bit. A long header continues with a 4-byte version, the destination connection id's
 * length and bytes, then the source connection id's. */
#define PP_QUIC_LONG 0x80
#define PP_QUIC_FIXED 0x40
#define PP_QUIC_SPIN 0x20
#define PP_QUIC_LONG_DCIL_OFF 5 /* flags, version */

/* What a QUIC packet carries. */
struct pp_quic {
	__u64 cid;      /* the 8 bytes where a connection id starts, big-endian: short header:
			 * the destination id; long: the source id (flow.h masks to the length) */
	__u8 form;      /* enum pp_quic_form */
	__u8 spin;      /* short header: the spin bit */
	__u8 cid_len;   /* long header: the source connection id's length */
	__u8 to_server; /* the packet goes to a QUIC port (the client's direction) */
	__u8 _pad[4];
};

enum pp_quic_form {
	PP_QUIC_NONE = 0,
	PP_QUIC_FORM_SHORT = 1,
	PP_QUIC_FORM_LONG = 2,
};

/* Per-packet flags, zeroed with one store per packet (the rest of struct pp_pkt is written
 * before it is read). */
struct pp_pkt_flags {
	__u8 pid_valid;
	__u8 reply_valid;
	__u8 event;      /* enum pp_flow_event_type the packet triggers, or 0 */
	__u8 reason;     /* enum pp_flow_reason */
	__u8 close_both; /* RST: both directions close */
	__u8 wait_edge;  /* mid-flow TCP: wait until the identifier changes before timestamping */
	__u8 pure_ack;   /* the request is a pure ACK this host sent (host_acks) */
	__u8 from_host;  /* sent by a socket of this host (egress, skb->sk set) */
};

/* A packet on its way through the monitor. */
struct pp_pkt {
	struct pkt p;           /* what parse_pkt() found */
	struct pp_pkt_id pid;   /* this packet's direction and identifier */
	struct pp_pkt_id reply; /* the reverse direction and the echoed identifier */
	struct pp_quic quic;
	struct pp_pkt_flags f;
	__u64 now;       /* ns (kedge_now()), 0 until pp_now() reads it */
	__u64 jiff;      /* jiffies (kedge_jiffies()), read for every measured packet */
	__u64 prev_seen; /* the packet's direction: ns of the packet before this one (ns_seen) */
	__u32 payload_len;
	__u32 ifindex;   /* the interface the packet arrived on (ingress only) */
	__u8 is_ingress;
	__u8 fwd;        /* index of this packet's direction in pp_flow_state */
	__u8 _pad[6];
};

/* The time in ns, read at most once per packet and only by the packets that need it (a
 * stored identifier, a sample, a rate limit about to expire): bpf_ktime_get_ns() costs tens
 * of ns on a virtualised clocksource, a third of a forwarded packet's budget. */
static __always_inline __u64 pp_now(struct pp_pkt *pp)
{
	if (!pp->now)
		pp->now = kedge_now();
	return pp->now;
}

/* The TCP identifiers of a segment whose timestamp option was found: TSval is the request
 * id, TSecr the echo (RFC 7323). */
static __always_inline void pp_ident_tcp_ts(const struct tcphdr *tcph, const struct pkt *p,
					    struct pp_pkt *pp, __u32 tsval, __u32 tsecr)
{
	pp->pid.id = tsval;
	pp->reply.id = tsecr;
	/* Data and SYNs are requests. A pure ACK's TSval in general is not (a receiver with
	 * delayed ACKs echoes the TSval of the data it acknowledges, ePPing skips them), but
	 * on an endpoint receiving data its own pure ACKs are the only packets whose echo
	 * measures the path: the sender's next segment echoes the latest ACK's TSval (RFC 7323
	 * section 4.3: TS.Recent follows segments at the left window edge, which a pure ACK
	 * is). So with host_acks, pure ACKs sent by a local socket are requests too; their
	 * echo is accepted only while the far end keeps sending (pp_match). TSecr means
	 * something only with ACK set (RFC 7323 section 3.2). */
	pp->f.pid_valid = p->payload_len > 0 || tcph->syn;
	if (!pp->f.pid_valid && pp->f.from_host && pp_cfg.host_acks && tcph->ack && !tcph->fin &&
	    !tcph->rst) {
		pp->f.pid_valid = 1;
		pp->f.pure_ack = 1;
	}
	pp->f.reply_valid = tcph->ack;
	pp->pid.flow.id_type = PP_ID_TCP_TS;
	if (tcph->rst) {
		pp->f.event = PP_FLOW_CLOSING;
		pp->f.reason = PP_REASON_RST;
		pp->f.close_both = 1;
	} else if (tcph->fin) {
		pp->f.event = PP_FLOW_CLOSING;
		pp->f.reason = PP_REASON_FIN;
	} else if (tcph->syn) {
		pp->f.event = PP_FLOW_OPENING;
		pp->f.reason = tcph->ack ? PP_REASON_SYN_ACK : PP_REASON_SYN;
	} else {
		/* Seen mid-flow: earlier segments may have carried this TSval already, and the
		 * echo refers to the first of them. */
		pp->f.wait_edge = 1;
	}
}

static __always_inline int pp_ident_tcp(void *data, void *data_end, const struct pkt *p,
					struct pp_pkt *pp, struct pp_counters *cnt)
{
	struct tcphdr *tcph = pkt_hdr(data, data_end, p->l4_off, sizeof(*tcph));
	__u32 tsval, tsecr;

	if (!tcph) {
		pp_count_parse_err(cnt, PARSE_ERR_TCP);
		return -1;
	}
	if (pp_cfg.skip_syn && tcph->syn) {
		COUNT(cnt, skip_syn);
		return -1;
	}
	if (parse_tcp_ts(tcph, data_end, &tsval, &tsecr) < 0) {
		COUNT(cnt, skip_no_tcp_ts);
		return -1;
	}
	pp_ident_tcp_ts(tcph, p, pp, tsval, tsecr);
	return 0;
}

static __always_inline int pp_ident_icmp(void *data, void *data_end, const struct pkt *p,
					 struct pp_pkt *pp, struct pp_counters *cnt)
{
	struct icmp_echo_hdr *ih = pkt_hdr(data, data_end, p->l4_off, sizeof(*ih));
	__u8 req = ICMP_ECHO, rep = ICMP_ECHOREPLY;

	if (!ih) {
		pp_count_parse_err(cnt, PARSE_ERR_ICMP);
		return -1;
	}
	if (p->l4_proto == IPPROTO_ICMPV6) {
		if (p->l3_proto != ETH_P_IPV6) {
			COUNT(cnt, skip_proto);
			return -1;
		}
		req = ICMPV6_ECHO_REQUEST;
		rep = ICMPV6_ECHO_REPLY;
	} else if (p->l3_proto != ETH_P_IP) {
		COUNT(cnt, skip_proto);
		return -1;
	}
	if (ih->code != 0 || (ih->type != req && ih->type != rep)) {
		COUNT(cnt, skip_icmp_type);
		return -1;
	}
	if (ih->type == req) {
		pp->pid.id = bpf_ntohs(ih->seq);
		pp->f.pid_valid = 1;
	} else {
		pp->reply.id = bpf_ntohs(ih->seq);
		pp->f.reply_valid = 1;
	}
	/* The echo identifier names the flow (one per ping process); parse.h put the
	 * sequence into dport. */
	pp->pid.flow.dport = ih->id;
	pp->pid.flow.id_type = PP_ID_ICMP_ECHO;
	return 0;
}

/* Where the packet is: the program's context (an __sk_buff at TC, an xdp_md with xdp set)
 * and its linear data. Every function that takes one is inlined into a program of one kind,
 * so the compiler drops the branches of the other. */
struct pp_ctx {
	void *ctx;
	void *data;
	void *data_end;
	int xdp;
	int from_host; /* egress packet of a local socket (skb->sk set) */
};

/* Copies len (a constant) bytes at offset off of the packet into buf. TC reads with
 * bpf_skb_load_bytes, which also reaches the paged part of a non-linear skb; an XDP frame
 * is one linear buffer (pping_xdp does not declare multi-buffer support), read in place. */
static __always_inline int pp_load(const struct pp_ctx *c, __u32 off, void *buf, __u32 len)
{
	void *src;

	if (!c->xdp)
		return bpf_skb_load_bytes(c->ctx, off, buf, len);
	src = pkt_hdr(c->data, c->data_end, off, len);
	if (!src)
		return -1;
	__builtin_memcpy(buf, src, len);
	return 0;
}

/* reqid_load() (reqid.h) for both hooks. reqid.h reads a TC packet's linear data, or through
 * bpf_skb_load_bytes, which XDP programs do not have (bpf_xdp_load_bytes needs 5.18), so XDP
 * reads the frame in place, byte by byte: the id may end at the frame's last byte, so there is no fixed window to
 * check. The checks and byte order are reqid_load()'s; the fixtures run both. */
static __always_inline int pp_reqid(const struct pp_ctx *c, const struct pkt *p,
				    const struct reqid_spec *spec, __u64 *id)
{
	__u32 len = spec->len, off = p->payload_off + spec->offset;
	__u64 v = 0;

	if (!c->xdp)
		return reqid_load(c->ctx, p, spec, id);
	if (len == 0 || len > REQID_MAX_LEN || (__u32)spec->offset + len > p->payload_len)
		return -1;
#pragma unroll
	for (int i = 0; i < REQID_MAX_LEN; i++) {
		__u8 *b;

		if (i >= len)
			break;
		b = pkt_hdr(c->data, c->data_end, off + i, 1);
		if (!b)
			return -1;
		v = spec->order == REQID_LITTLE_ENDIAN ? v | (__u64)*b << (8 * i) : v << 8 | *b;
	}
	*id = v;
	return 0;
}

/* DNS: a query (QR=0) to port 53 is a request, a response (QR=1) from port 53 a reply;
 * the 16-bit transaction id is the identifier. */
static __always_inline int pp_ident_dns(const struct pp_ctx *c, const struct pkt *p,
					struct pp_pkt *pp, struct pp_counters *cnt)
{
	__be16 hdr[2]; /* id, flags */
	__u16 flags;

	if (p->payload_len < PP_DNS_HDR_LEN || pp_load(c, p->payload_off, hdr, sizeof(hdr)) < 0) {
		COUNT(cnt, skip_udp_short);
		return -1;
	}
	flags = bpf_ntohs(hdr[1]);
	if (!(flags & PP_DNS_QR) && p->dport == bpf_htons(PP_DNS_PORT)) {
		pp->pid.id = bpf_ntohs(hdr[0]);
		pp->f.pid_valid = 1;
	} else if ((flags & PP_DNS_QR) && p->sport == bpf_htons(PP_DNS_PORT)) {
		pp->reply.id = bpf_ntohs(hdr[0]);
		pp->f.reply_valid = 1;
	} else {
		COUNT(cnt, skip_proto);
		return -1;
	}
	pp->pid.flow.id_type = PP_ID_DNS;
	return 0;
}

/* Reads the 8 bytes at off as a big-endian number. A connection id shorter than 8 bytes is
 * followed by more of the packet (a valid QUIC packet always is: at least a packet number
 * and an AEAD tag), so reading 8 bytes and masking to the id's length works for every
 * length; fewer than 8 bytes left is a truncated packet. */
static __always_inline int pp_quic_cid(const struct pp_ctx *c, __u32 off, __u32 avail, __u64 *cid)
{
	__be64 v;

	if (avail < PP_QUIC_ID_BYTES || pp_load(c, off, &v, sizeof(v)) < 0)
		return -1;
	*cid = bpf_be64_to_cpu(v);
	return 0;
}

/* QUIC on a configured port. A short header (form bit clear, fixed bit set) carries the spin
 * bit and the destination connection id, whose length the packet does not say (flow.h knows
 * it from the handshake); a long header (form bit set) carries no spin bit but both ids with
 * their lengths: the source id's length is the one the reverse direction's short headers
 * will carry. Version negotiation (version 0) and a clear fixed bit are not QUIC v1/v2
 * packets the monitor reads (RFC 9287 lets endpoints grease the fixed bit): skip_proto. */
static __always_inline int pp_ident_quic(const struct pp_ctx *c, const struct pkt *p,
					 struct pp_pkt *pp, __u8 to_server,
					 struct pp_counters *cnt)
{
	__u32 off = p->payload_off, len = p->payload_len;
	__u8 hdr[PP_QUIC_LONG_DCIL_OFF + 1];
	__u8 first, dcil, scil;

	if (len < 1 || pp_load(c, off, &first, 1) < 0) {
		COUNT(cnt, skip_udp_short);
		return -1;
	}
	if (!(first & PP_QUIC_FIXED)) {
		COUNT(cnt, skip_proto);
		return -1;
	}
	pp->quic.to_server = to_server;
	pp->pid.flow.id_type = PP_ID_QUIC_SPIN;
	/* Every QUIC packet may open the flow (the spin state needs it); none carries an
	 * identifier or an echo in pkt_ts's sense. */
	pp->f.pid_valid = 1;
	if (!(first & PP_QUIC_LONG)) {
		pp->quic.form = PP_QUIC_FORM_SHORT;
		pp->quic.spin = !!(first & PP_QUIC_SPIN);
		if (pp_quic_cid(c, off + 1, len - 1, &pp->quic.cid) < 0) {
			COUNT(cnt, skip_udp_short);
			return -1;
		}
		COUNT(cnt, quic_short);
		return 0;
	}
	if (len < sizeof(hdr) + 1 || pp_load(c, off, hdr, sizeof(hdr)) < 0) {
		COUNT(cnt, skip_udp_short);
		return -1;
	}
	if (!hdr[1] && !hdr[2] && !hdr[3] && !hdr[4]) {
		COUNT(cnt, skip_proto); /* version negotiation */
		return -1;
	}
	dcil = hdr[PP_QUIC_LONG_DCIL_OFF];
	if (dcil > PP_QUIC_CID_MAX) {
		COUNT(cnt, skip_proto);
		return -1;
	}
	/* scil's offset: the header, dcil bytes of destination id. */
	off += sizeof(hdr) + dcil;
	if (len < sizeof(hdr) + dcil + 1 || pp_load(c, off, &scil, 1) < 0) {
		COUNT(cnt, skip_udp_short);
		return -1;
	}
	if (scil > PP_QUIC_CID_MAX) {
		COUNT(cnt, skip_proto);
		return -1;
	}
	if (len < sizeof(hdr) + dcil + 1 + scil) {
		COUNT(cnt, skip_udp_short);
		return -1;
	}
	if (pp_quic_cid(c, off + 1, len - (sizeof(hdr) + dcil + 1), &pp->quic.cid) < 0) {
		COUNT(cnt, skip_udp_short);
		return -1;
	}
	pp->quic.cid_len = scil; /* the length the reverse direction's short headers carry */
	pp->quic.form = PP_QUIC_FORM_LONG;
	COUNT(cnt, quic_long);
	return 0;
}

/* Whether port (network order) is one of the configured QUIC ports. */
static __always_inline int pp_quic_port(__u16 port)
{
#pragma unroll
	for (int i = 0; i < PP_MAX_QUIC_PORTS; i++) {
		if (!pp_cfg.quic_ports[i])
			return 0;
		if (pp_cfg.quic_ports[i] == port)
			return 1;
	}
	return 0;
}

/* UDP: a configured service, QUIC, then DNS. A service datagram to its port is a request,
 * one from its port a response, both carrying the request id described by reqid.h. */
static __always_inline int pp_ident_udp(const struct pp_ctx *c, const struct pkt *p,
					struct pp_pkt *pp, struct pp_counters *cnt)
{
	struct reqid_spec *req = NULL, *rep = NULL;
	__u16 port;

	if (pp_cfg.track_udp) {
		port = p->dport;
		req = bpf_map_lookup_elem(&services, &port);
		port = p->sport;
		rep = bpf_map_lookup_elem(&services, &port);
	}
	/* Tested one by one: clang would OR the two pointers, which the verifier refuses. */
	if (req) {
		pp->pid.flow.id_type = PP_ID_UDP_REQID;
		if (pp_reqid(c, p, req, &pp->pid.id) == 0)
			pp->f.pid_valid = 1;
	}
	if (rep) {
		pp->pid.flow.id_type = PP_ID_UDP_REQID;
		if (pp_reqid(c, p, rep, &pp->reply.id) == 0)
			pp->f.reply_valid = 1;
	}
	if (pp->pid.flow.id_type == PP_ID_UDP_REQID) {
		if (pp->f.pid_valid || pp->f.reply_valid)
			return 0;
		COUNT(cnt, skip_udp_short);
		return -1;
	}
	if (pp_cfg.track_quic) {
		if (pp_quic_port(p->dport))
			return pp_ident_quic(c, p, pp, 1, cnt);
		if (pp_quic_port(p->sport))
			return pp_ident_quic(c, p, pp, 0, cnt);
	}
	if (pp_cfg.track_dns &&
	    (p->dport == bpf_htons(PP_DNS_PORT) || p->sport == bpf_htons(PP_DNS_PORT)))
		return pp_ident_dns(c, p, pp, cnt);
	COUNT(cnt, skip_proto);
	return -1;
}

/* pp_src_sorts_first: whether the packet's own direction is the canonical flow key, i.e.
 * its source endpoint sorts first. Any total order works; this one compares the raw words.
 * internal/pping/gc.go has the same order. */
static __always_inline int pp_src_sorts_first(const struct pp_tuple *t)
{
#pragma unroll
	for (int i = 0; i < 4; i++) {
		__u32 a = t->saddr.in6_u.u6_addr32[i], b = t->daddr.in6_u.u6_addr32[i];

		if (a != b)
			return a < b;
	}
	return t->sport <= t->dport;
}

static __always_inline void pp_reverse(struct pp_tuple *dst, const struct pp_tuple *src)
{
	dst->saddr = src->daddr;
	dst->daddr = src->saddr;
	dst->sport = src->dport;
	dst->dport = src->sport;
	dst->proto = src->proto;
	dst->ipv = src->ipv;
	dst->id_type = src->id_type;
	dst->_pad = 0;
}

/* Fills pp from a parsed packet (pp->p; pp->f zeroed). Returns 0 when the packet carries an
 * identifier, an echo or QUIC's spin bit, -1 (counted) when it cannot be measured. */
/* The packet's own direction from pp->p, no identifier yet. */
static __always_inline void pp_ident_begin(const struct pp_ctx *c, struct pp_pkt *pp)
{
	const struct pkt *p = &pp->p;

	pp->pid.flow.saddr = p->saddr;
	pp->pid.flow.daddr = p->daddr;
	pp->pid.flow.sport = p->sport;
	pp->pid.flow.dport = p->dport;
	pp->pid.flow.proto = p->l4_proto;
	pp->pid.flow.ipv = p->l3_proto == ETH_P_IP ? 4 : 6;
	pp->pid.flow.id_type = PP_ID_NONE;
	pp->pid.flow._pad = 0;
	pp->pid.id = 0;
	pp->reply.id = 0;
	pp->quic.form = PP_QUIC_NONE;
	pp->payload_len = p->payload_len;
	pp->f.from_host = c->from_host;
}

/* The reverse direction and the canonical order, once the packet is measured. */
static __always_inline void pp_ident_end(struct pp_pkt *pp)
{
	pp_reverse(&pp->reply.flow, &pp->pid.flow);
	pp->fwd = pp_src_sorts_first(&pp->pid.flow) ? 0 : 1;
}

static __always_inline int pp_identify(const struct pp_ctx *c, struct pp_pkt *pp,
				       struct pp_counters *cnt)
{
	const struct pkt *p = &pp->p;
	int ret;

	pp_ident_begin(c, pp);
	switch (p->l4_proto) {
	case IPPROTO_TCP:
		if (!pp_cfg.track_tcp)
			goto skip;
		ret = pp_ident_tcp(c->data, c->data_end, p, pp, cnt);
		break;
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6:
		if (!pp_cfg.track_icmp)
			goto skip;
		ret = pp_ident_icmp(c->data, c->data_end, p, pp, cnt);
		break;
	case IPPROTO_UDP:
		ret = pp_ident_udp(c, p, pp, cnt);
		break;
	default:
		goto skip;
	}
	if (ret < 0)
		return ret;
	pp_ident_end(pp);
	return 0;
skip:
	COUNT(cnt, skip_proto);
	return -1;
}

/* The fast path: most packets of a monitored link are TCP segments of one shape - Ethernet
 * without VLAN tags, IPv4 without options or fragmentation (or IPv6 without extension
 * headers), TCP whose options start with NOP, NOP, timestamp (Linux's, BSD's and macOS's
 * layout). pp_fast_tcp() reads those at fixed offsets, checks what parse_pkt() checks, and
 * fills pp exactly as parse_pkt() and pp_identify() would; anything else, and anything
 * that would be an error, goes the general way (PP_FAST_NO). For a packet that produces no
 * sample this is most of its cost: a dozen loads instead of the general walk's branches,
 * and a few cache lines of program instead of the whole parser's. TestFastPath runs every
 * fixture with it off and on. */
#define PP_FAST_NO 1
#define PP_TCPOPT_NOP_NOP_TS 0x0101080aU /* NOP, NOP, kind 8, length 10 */
#define PP_TCP_HDR_MAX 60                 /* doff's largest value, 15 words */

/* The headers of the fast path's shape, checked: returns the TCP header (its options
 * start NOP, NOP, timestamp and lie in the linear data with the whole header) or NULL, and
 * sets *ip to the IPv4 or IPv6 header (*v6 says which) and *l3len to the IP payload's
 * length. A packet whose IP payload is longer than max_l3len is refused as soon as the IP
 * header says so (a constant: the compiler drops the test when it is ~0U). */
static __always_inline struct tcphdr *pp_fast_hdrs(void *data, void *end, void **ip, int *v6,
						   __u32 *l3len, __u32 max_l3len)
{
	struct ethhdr *eth = data;
	struct tcphdr *tcph;
	__u32 doff;
	__u8 *opt;

	if ((void *)(eth + 1) > end)
		return NULL;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *iph = (void *)(eth + 1);

		if ((void *)(iph + 1) > end || iph->version != 4 || iph->ihl != 5 ||
		    iph->protocol != IPPROTO_TCP || (iph->frag_off & bpf_htons(IP_MF | IP_OFFSET)))
			return NULL;
		*l3len = bpf_ntohs(iph->tot_len);
		if (*l3len < sizeof(*iph))
			return NULL;
		*l3len -= sizeof(*iph);
		if (*l3len > max_l3len)
			return NULL;
		*ip = iph;
		*v6 = 0;
		tcph = (void *)(iph + 1);
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6h = (void *)(eth + 1);

		if ((void *)(ip6h + 1) > end || ip6h->version != 6 || ip6h->nexthdr != IPPROTO_TCP)
			return NULL;
		*l3len = bpf_ntohs(ip6h->payload_len);
		if (*l3len > max_l3len)
			return NULL;
		*ip = ip6h;
		*v6 = 1;
		tcph = (void *)(ip6h + 1);
	} else {
		return NULL;
	}
	opt = (__u8 *)(tcph + 1);
	if ((void *)(opt + TCPOLEN_TIMESTAMP + 2) > end)
		return NULL;
	doff = tcph->doff * 4;
	if (doff < sizeof(*tcph) + TCPOLEN_TIMESTAMP + 2 || (void *)tcph + doff > end ||
	    *l3len < doff || *(__be32 *)opt != bpf_htonl(PP_TCPOPT_NOP_NOP_TS))
		return NULL;
	return tcph;
}

static __always_inline int pp_fast_tcp(const struct pp_ctx *c, struct pp_pkt *pp,
				       struct pp_counters *cnt)
{
	void *data = c->data, *ip;
	struct tcphdr *tcph;
	struct pkt *p = &pp->p;
	__u32 l3len, l4off, doff;
	__u8 *opt;
	int v6;

	tcph = pp_fast_hdrs(data, c->data_end, &ip, &v6, &l3len, ~0U);
	if (!tcph)
		return PP_FAST_NO;
	if (!v6) {
		struct iphdr *iph = ip;

		ipv4_mapped(&p->saddr, iph->saddr);
		ipv4_mapped(&p->daddr, iph->daddr);
		p->l3_proto = ETH_P_IP;
		p->ttl = iph->ttl;
		p->tos = iph->tos;
	} else {
		struct ipv6hdr *ip6h = ip;

		p->saddr = ip6h->saddr;
		p->daddr = ip6h->daddr;
		p->l3_proto = ETH_P_IPV6;
		p->ttl = ip6h->hop_limit;
		p->tos = (ip6h->priority << 4) | (ip6h->flow_lbl[0] >> 4);
	}
	opt = (__u8 *)(tcph + 1);
	doff = tcph->doff * 4;
	l4off = (void *)tcph - data;
	p->sport = tcph->source;
	p->dport = tcph->dest;
	p->l4_proto = IPPROTO_TCP;
	p->flags = 0;
	p->l3_off = sizeof(struct ethhdr);
	p->l4_off = l4off;
	p->payload_off = l4off + doff;
	p->payload_len = l3len - doff;
	p->_pad = 0;
	if (!pp_cfg.track_tcp) {
		COUNT(cnt, skip_proto);
		return -1;
	}
	pp_ident_begin(c, pp);
	if (pp_cfg.skip_syn && tcph->syn) {
		COUNT(cnt, skip_syn);
		return -1;
	}
	pp_ident_tcp_ts(tcph, p, pp, bpf_ntohl(*(__be32 *)(opt + 4)), bpf_ntohl(*(__be32 *)(opt + 8)));
	pp_ident_end(pp);
	return 0;
}

#endif /* KEDGE_PPING_IDENT_H */
