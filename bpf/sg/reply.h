/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* reply.h - what whole replies (gather.h) and parts of multi-packet replies (parts.h) share:
 * the reduction loops (sg_finish.h: the slot lookup, a reply's outcome and verdict). */
#ifndef KEDGE_SG_REPLY_H
#define KEDGE_SG_REPLY_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "counters.h"
#include "sg.h"
#include "maps.h"
#include "sg_finish.h"

/* One loop per (operation, element type): a loop that branched on them per element
 * would multiply the verifier's states (it walks every iteration). Element i of the
 * payload goes into accumulator off + i (a part of a multi-packet reply; 0 for a single
 * packet); the mask keeps the index inside the block for the verifier, user space and
 * the part checks keep off + n <= elems <= SG_AGG_ELEMS. */
#define LOAD_I32(src, i) ((__s64)(__s32)bpf_ntohl(((__be32 *)(src))[i]))
#define LOAD_I64(src, i) ((__s64)bpf_be64_to_cpu(((__be64 *)(src))[i]))
#define ELEM_LOOP(n, src, data_end, T, LOAD, BODY)                           \
	for (__u32 i = 0; i < SG_AGG_ELEMS; i++) {                           \
		__s64 x, *a;                                                 \
		if (i >= (n) || (void *)((T *)(src) + i + 1) > (data_end))   \
			break;                                               \
		x = LOAD(src, i);                                            \
		a = &acc[(off + i) & (SG_AGG_ELEMS - 1)];                    \
		BODY;                                                        \
	}

static __always_inline void reduce_i32(struct sg_slot *s, __u32 op, __u32 off, __u32 n, void *v,
				       void *data_end)
{
	__s64 *acc = s->res.agg;

	switch (op) {
	case SG_RED_SUM: /* int32 into int64: 1024 of them cannot wrap */
		ELEM_LOOP(n, v, data_end, __be32, LOAD_I32, *a += x);
		break;
	case SG_RED_MIN:
		ELEM_LOOP(n, v, data_end, __be32, LOAD_I32, if (x < *a) *a = x);
		break;
	case SG_RED_MAX:
		ELEM_LOOP(n, v, data_end, __be32, LOAD_I32, if (x > *a) *a = x);
		break;
	default: /* the first reply of a MIN/MAX request */
		ELEM_LOOP(n, v, data_end, __be32, LOAD_I32, *a = x);
	}
}

static __always_inline void reduce_i64(struct sg_slot *s, __u32 op, __u32 off, __u32 n, void *v,
				       void *data_end)
{
	__s64 *acc = s->res.agg;
	__u32 over = 0;

	switch (op) {
	case SG_RED_SUM:
		ELEM_LOOP(n, v, data_end, __be64, LOAD_I64, over |= __builtin_add_overflow(*a, x, a));
		if (over)
			s->res.flags |= SG_F_OVERFLOW;
		break;
	case SG_RED_MIN:
		ELEM_LOOP(n, v, data_end, __be64, LOAD_I64, if (x < *a) *a = x);
		break;
	case SG_RED_MAX:
		ELEM_LOOP(n, v, data_end, __be64, LOAD_I64, if (x > *a) *a = x);
		break;
	default:
		ELEM_LOOP(n, v, data_end, __be64, LOAD_I64, *a = x);
	}
}

#endif /* KEDGE_SG_REPLY_H */
