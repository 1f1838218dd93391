/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* sg_finish.h - the end of a reply's path, shared by the gather (gather.h, parts.h) and user
 * reductions (sg_user.h): the request's slot, the worker's bit, the outcome of a reply under
 * the slot's lock, and its counters and verdict. */
#ifndef KEDGE_SG_FINISH_H
#define KEDGE_SG_FINISH_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "counters.h"
#include "sg.h"
#include "sg_maps.h"

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

#endif /* KEDGE_SG_FINISH_H */
