/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* frame.h - the pacer's frames: writing a tick frame over an skb's first bytes (the entry
 * builds one from each tick request; a filler pass rewrites its filler into one), and telling
 * a conveyor filler. The consumer's side reads tick frames (pacer_tick_of, pacer_client.h). */
#ifndef KEDGE_PACER_FRAME_H
#define KEDGE_PACER_FRAME_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "parse.h"
#include "csum.h"
#include "counters.h"
#include "pacer_client.h"

/* pacer_tick_ip returns the tick frame's IPv4 header, checksum included. */
static __always_inline struct iphdr pacer_tick_ip(__u32 frame_len)
{
	struct iphdr ip = {
		.version = 4,
		.ihl = 5,
		.tot_len = bpf_htons(frame_len - sizeof(struct ethhdr)),
		.protocol = PACER_IPPROTO,
	};

	csum_ipv4_set(&ip);
	return ip;
}

/* pacer_write_tick writes the tick frame's headers and payload over the skb's first bytes. */
static __always_inline int pacer_write_tick(struct __sk_buff *skb, struct pacer_tick *t)
{
	struct ethhdr eth = {
		.h_dest = { 0x02, 'k', 'p', 'a', 'c', 'e' },
		.h_source = { 0x02, 'k', 'p', 'a', 'c', 'e' },
		.h_proto = bpf_htons(ETH_P_IP),
	};
	struct iphdr ip = pacer_tick_ip(skb->len);

	if (bpf_skb_store_bytes(skb, 0, &eth, sizeof(eth), 0) < 0 ||
	    bpf_skb_store_bytes(skb, sizeof(eth), &ip, sizeof(ip), 0) < 0 ||
	    bpf_skb_store_bytes(skb, sizeof(eth) + sizeof(ip), t, sizeof(*t), 0) < 0)
		return -1;
	return 0;
}

/* pacer_filler_of returns the conveyor filler the frame carries, or NULL. */
static __always_inline struct pacer_filler *pacer_filler_of(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct hdr_cursor nh = { .pos = data };
	struct ethhdr *eth;
	struct pacer_filler *f;
	__u8 flags = 0;

	if (parse_ethhdr(&nh, data_end, &eth, &flags) != PACER_FILLER_ETH_P)
		return NULL;
	f = pkt_hdr(data, data_end, nh.pos - data, sizeof(*f));
	if (!f || f->magic != PACER_FILLER_MAGIC)
		return NULL;
	return f;
}

/* The bytes of a filler frame that matter: Ethernet header, magic and stamp. */
#define PACER_FILLER_HEAD (sizeof(struct ethhdr) + sizeof(struct pacer_filler))

/* pacer_redirect sends the packet out of ifindex (egress), counting a failure. */
static __always_inline int pacer_redirect(__u32 ifindex, struct pacer_stats *ps)
{
	long ret = bpf_redirect(ifindex, 0);

	if (ret != TC_ACT_REDIRECT)
		COUNT(ps, redirect_errors);
	return ret;
}

#endif /* KEDGE_PACER_FRAME_H */
