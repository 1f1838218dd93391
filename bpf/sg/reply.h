/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* reply.h - what whole replies (gather.h) and parts of multi-packet replies (parts.h) share:
 * the reduction loops, the slot lookup, the worker's bit, the outcome of a reply under the
 * slot's lock and its counters and verdict. */
#ifndef KEDGE_SG_REPLY_H
#define KEDGE_SG_REPLY_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "counters.h"
#include "sg.h"
#include "maps.h"

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

enum gather_outcome {
	G_REDUCED = 0,
	G_COMPLETED,
	G_STALE,
	G_LATE,
	G_DUP,
	G_PART,        /* a part reduced, the worker has parts to come */
	G_PART_DUP,
	G_PART_MISMATCH,
};
#define G_OVERFLOWED 0x100 /* or-ed in: this reply made an int64 sum wrap */

/* answered marks a worker as answered (under s->lock): G_COMPLETED when that completes
 * the request, else G_REDUCED. */
static __always_inline int answered(struct sg_slot *s, __u32 word, __u64 mask, __u64 now)
{
	s->res.bitmap[word] |= mask;
	s->res.count++;
	if (s->res.count < s->res.need)
		return G_REDUCED;
	s->state = SG_SLOT_DONE;
	s->res.done_ns = now;
	return G_COMPLETED;
}

/* overflowed is G_OVERFLOWED when the reply just reduced made an int64 sum wrap. */
static __always_inline int overflowed(const struct sg_slot *s, __u16 flags_before)
{
	return !(flags_before & SG_F_OVERFLOW) && (s->res.flags & SG_F_OVERFLOW) ? G_OVERFLOWED : 0;
}

/* worker_bit returns worker widx's bit in its bitmap word and sets *word. */
static __always_inline __u64 worker_bit(__u32 widx, __u32 *word)
{
	__u32 w = widx / 64;

	/* widx < SG_WORKERS_MAX is known to clang, which would drop the mask; 5.10's verifier
	 * no longer knows it here, so keep the mask behind a barrier. */
	barrier_var(w);
	*word = w & (SG_BITMAP_WORDS - 1);
	return 1ULL << (widx & 63);
}

/* gather_finish counts what happened to a reply (outside the slot's lock) and returns its
 * verdict; the reply that completed the request emits the result. */
static __always_inline int gather_finish(int outcome, struct sg_slot *s, const struct sg_group *g,
					 struct sg_stats *cnt)
{
	if (outcome & G_OVERFLOWED) {
		COUNT(cnt, overflow);
		outcome &= 0xff;
	}
	switch (outcome) {
	case G_STALE:
		COUNT(cnt, stale);
		break;
	case G_LATE:
		COUNT(cnt, late);
		break;
	case G_DUP:
		COUNT(cnt, duplicates);
		break;
	case G_PART:
		break;
	case G_PART_DUP:
		COUNT(cnt, part_dups);
		break;
	case G_PART_MISMATCH:
		COUNT(cnt, part_mismatch);
		break;
	case G_COMPLETED:
		COUNT(cnt, replies);
		COUNT(cnt, completed);
		if (g->flags & SG_GF_WAKE_SOCKET) {
			/* The result is committed before the packet goes up the stack, so the
			 * reader the socket wakes finds it in the ring. */
			emit_result(s, cnt, BPF_RB_NO_WAKEUP);
			return XDP_PASS;
		}
		emit_result(s, cnt, 0);
		break;
	default:
		COUNT(cnt, replies);
	}
	return XDP_DROP;
}

/* reply_slot reads a reply's request id and finds its slot; NULL when the reply is dropped
 * before the slot's lock: the worker reported an error (worker_errors) or the id's slot is
 * not one of the group's (stale). Shared by whole replies (gather) and parts (gather_part). */
static __always_inline struct sg_slot *reply_slot(const struct sg_hdr *h, const struct sg_group *g,
						  struct sg_stats *cnt, __u64 *id, __u32 *slot)
{
	struct sg_slot *s;

	if (h->status) {
		COUNT(cnt, worker_errors);
		return NULL;
	}
	*id = bpf_be64_to_cpu(h->req_id);
	*slot = *id & SG_SLOT_MASK;
	s = bpf_map_lookup_elem(&slots, slot);
	if (!s || *slot - g->slot_base >= g->nslots) {
		COUNT(cnt, stale);
		return NULL;
	}
	return s;
}

#endif /* KEDGE_SG_REPLY_H */
