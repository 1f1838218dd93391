/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* pktword.h - a few bytes of a packet (the request id, a hedgeable rule's bytes) read straight
 * from the skb's linear data when they lie in it (always on veth and loopback), through
 * bpf_skb_load_bytes otherwise: the helper call costs more than the rest of the read. */
#ifndef KEDGE_HEDGE_PKTWORD_H
#define KEDGE_HEDGE_PKTWORD_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "parse.h"

/* pkt_word reads the len (1..8) bytes at offset off of skb (from skb->data, as
 * bpf_skb_load_bytes counts) into *w as they lie in memory: byte i of the packet is byte i of
 * the word (little-endian objects: its low bytes), the bytes past len zero. 0, or -1 when the
 * packet is shorter. */
static __always_inline int pkt_word(struct __sk_buff *skb, __u32 off, __u32 len, __u64 *w)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u64 v = 0;
	__u32 n = len - 1;
	__u8 *b;

	/* 1..8 to every verifier (5.10 and 6.1 lose the range of the callers' checks). */
	barrier_var(n);
	n &= 7;
	barrier_var(off);
	if (off <= 0xfff0) {
		b = data + off;
		/* A whole word in the linear data: one load, the bytes past len masked off. */
		if ((void *)(b + sizeof(v)) <= data_end) {
			v = *(__u64 *)b;
			if (n < 7)
				v &= (1ULL << (8 * (n + 1))) - 1;
			*w = v;
			return 0;
		}
	}
	if (bpf_skb_load_bytes(skb, off, &v, n + 1) < 0)
		return -1;
	*w = v;
	return 0;
}

#endif /* KEDGE_HEDGE_PKTWORD_H */
