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
 * extended). Returns 0, or -1 when the datagram is shorter than offset+len or the spec is
 * invalid; callers count that as "short request" and leave the packet alone. */
static __always_inline int reqid_load(struct __sk_buff *skb, const struct pkt *p,
				      const struct reqid_spec *spec, __u64 *id)
{
	__u8 buf[REQID_MAX_LEN] = {};
	__u32 len = spec->len, n;
	__u64 v = 0;

	if (len == 0 || len > REQID_MAX_LEN)
		return -1;
	if ((__u32)spec->offset + len > p->payload_len)
		return -1;
	/* The length must be provably 1..8 to every verifier (5.10 and 6.1 lose the range of
	 * the checks above): compute it as (len - 1) & 7, plus one, behind a barrier. */
	n = len - 1;
	barrier_var(n);
	n &= REQID_MAX_LEN - 1;
	if (bpf_skb_load_bytes(skb, p->payload_off + spec->offset, buf, n + 1) < 0)
		return -1;
#pragma unroll
	for (int i = 0; i < REQID_MAX_LEN; i++) {
		if (i >= len)
			break;
		if (spec->order == REQID_LITTLE_ENDIAN)
			v |= (__u64)buf[i] << (8 * i);
		else
			v = (v << 8) | buf[i];
	}
	*id = v;
	return 0;
}

#endif /* KEDGE_REQID_H */
