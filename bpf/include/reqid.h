/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* reqid.h - where a UDP service keeps its request id, and how to read it.
 *
 * Shared by the hedger (bpf/hedge) and the latency monitor (bpf/pping), so a hedging
 * deployment gets per-service RTTs from the same description. The id is a 1..8 byte field
 * at a fixed offset from the start of the UDP payload, in big- or little-endian order, and
 * the response carries the same field at the same offset. */
#ifndef KEDGE_REQID_H
#define KEDGE_REQID_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "parse.h"

#define REQID_MAX_LEN 8

enum reqid_order {
	REQID_BIG_ENDIAN = 0,
	REQID_LITTLE_ENDIAN = 1,
};

struct reqid_spec {
	__u16 offset; /* from the first byte of the UDP payload */
	__u8 len;     /* 1..REQID_MAX_LEN */
	__u8 order;   /* enum reqid_order */
};

/* reqid_load reads the request id of a parsed UDP packet into *id (host order, zero
 * extended), through pkt_word (parse.h): no helper call when the id lies in the skb's linear
 * data. Returns 0, or -1 when the datagram is shorter than offset+len or the spec is
 * invalid; callers count that as "short request" and leave the packet alone. */
static __always_inline int reqid_load(struct __sk_buff *skb, const struct pkt *p,
				      const struct reqid_spec *spec, __u64 *id)
{
	__u32 len = spec->len;
	__u64 w;

	if (len == 0 || len > REQID_MAX_LEN)
		return -1;
	if ((__u32)spec->offset + len > p->payload_len)
		return -1;
	if (pkt_word(skb, p->payload_off + spec->offset, len, &w) < 0)
		return -1;
	/* pkt_word keeps the packet's byte order: byte 0 in the low bits. Big-endian ids turn
	 * it around and shift the bytes past len out. */
	if (spec->order != REQID_LITTLE_ENDIAN)
		w = __builtin_bswap64(w) >> (8 * (REQID_MAX_LEN - len));
	*id = w;
	return 0;
}

#endif /* KEDGE_REQID_H */
