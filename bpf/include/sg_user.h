/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* sg_user.h - the kit for reductions written by the user (SG_RED_USER; docs/sg.md, "User
 * reductions"; an example: bpf/sg/user/topk.bpf.c).
 *
 * A user reduction is an XDP program that the gather tail-calls (sg_user_progs) for every
 * reply of a group whose reduction is SG_RED_USER, once the reply has passed the checks
 * every reply passes first (gather.h: sg header, configured group, registered worker,
 * single packet, payload_len == elems * size and inside the packet). This header does the
 * rest as the built-in reductions do: it drops a reply with a status (worker_errors) or
 * whose slot is not one of the group's (stale), and under the slot's lock it checks the
 * full request id (else stale), that the request is pending (else late) and that the
 * worker has not answered yet (else duplicates); then it calls the user's function, marks
 * the worker answered, completes the request when enough workers have, emits the result
 * and counts. The user writes one function,
 *
 *	static __always_inline int my_reduce(struct sg_result *res, const struct sg_group *g,
 *					     const void *v, const void *end)
 *
 * and makes the program with SG_USER_REDUCTION(my_prog, my_reduce). The function folds the
 * reply's payload v (g->elems elements of g->dtype, big-endian; sg_user_elem reads them,
 * checked against end) into res->agg, the SG_AGG_ELEMS int64 accumulators of the request,
 * which the scatter set to 0 for the first g->elems. res->count is the replies reduced
 * before this one (0: the first). It returns 0 when it reduced the reply; anything else
 * refuses it: dropped, counted user_refused, the worker not marked answered (the
 * accumulators must then be as they were). user space reads res->agg[0..elems) as the
 * result's Values. It runs under the slot's spin lock: no helper calls and no calls to
 * functions that are not inlined; the verifier checks each access like any program's.
 *
 * Build (the project's flags; from a kedge checkout, with clang 19):
 *	clang-19 -target bpf -O2 -g -mcpu=v3 -Wall -Werror -I bpf/include \
 *		-c my_reduce.bpf.c -o my_reduce.o
 * internal/sg.LoadUserReduction loads the object with its maps groups, slots, results,
 * stats and sg_user_call replaced by the running gather's (sg_maps.h: an object built
 * against another version of sg.h is refused with the map that differs). */
#ifndef KEDGE_SG_USER_H
#define KEDGE_SG_USER_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "counters.h"
#include "sg.h"
#include "sg_maps.h"
#include "sg_finish.h"

/* The version of this kit (and of the maps it shares): internal/sg.LoadUserReduction
 * refuses an object without it or with another (internal/sg.UserABI). */
const volatile __u32 sg_user_abi = 1;

/* The user's function refused the reply (an outcome of sg_finish.h's kind). */
#define G_USER_REFUSED 0x80

/* The sg header's offset in the packet the kit accepts: far past any stack of headers the
 * gather parses, and small enough that the verifier bounds pointers into the payload
 * (a packet pointer may carry a variable offset up to 0xffff, constant offset included). */
#define SG_USER_OFF_MAX 0x3fff

/* sg_user_elem reads element i of the payload v (the group's dtype, big-endian) into *x,
 * int32 sign-extended; 0 when element i is not inside the packet (end). */
static __always_inline int sg_user_elem(const struct sg_group *g, const void *v, const void *end,
					__u32 i, __s64 *x)
{
	if (g->dtype == SG_T_I64) {
		const __be64 *e = (const __be64 *)v + i;

		if ((const void *)(e + 1) > end)
			return 0;
		*x = (__s64)bpf_be64_to_cpu(*e);
		return 1;
	}
	const __be32 *e = (const __be32 *)v + i;

	if ((const void *)(e + 1) > end)
		return 0;
	*x = (__s32)bpf_ntohl(*e);
	return 1;
}

/* What the kit knows of the reply it runs for. */
struct sg_user_in {
	const struct sg_group *g;
	struct sg_stats *cnt;
	void *v;
	void *end;
	__u64 id;
	__u64 mask;
	__u64 now;
	__u64 gid;
	__u64 word;
};

/* sg_user_begin reads what the gather handed on (struct sg_user_call) and returns the
 * request's slot; NULL when the reply is dropped: the program was not run by the gather or
 * what it was handed does not hold (user_errors), the worker reported an error
 * (worker_errors) or the request id's slot is not one of the group's (stale). */
static __always_inline struct sg_slot *sg_user_begin(struct xdp_md *ctx, struct sg_user_in *in)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct sg_user_call *c;
	struct sg_slot *s;
	struct sg_hdr *h;
	__u32 zero = 0, gid, slot, widx, word;
	__u64 off, len, id;

	c = bpf_map_lookup_elem(&sg_user_call, &zero);
	if (!c || !c->armed) {
		COUNT(stats_for(NO_GROUP), user_errors);
		return NULL;
	}
	c->armed = 0;
	gid = c->group;
	widx = c->worker;
	off = c->off;
	len = c->len;
	in->gid = gid;
	in->g = gid < SG_GROUPS_MAX ? bpf_map_lookup_elem(&groups, &gid) : NULL;
	in->cnt = stats_for(gid < SG_GROUPS_MAX ? gid : NO_GROUP);
	h = data + off;
	if (!in->g || widx >= SG_WORKERS_MAX || off > SG_USER_OFF_MAX || len > SG_AGG_BYTES ||
	    (void *)(h + 1) > data_end || (void *)(h + 1) + len > data_end) {
		COUNT(in->cnt, user_errors);
		return NULL;
	}
	/* status (worker_errors) and the slot (stale), as the gather checks them */
	s = reply_slot(h, in->g, in->cnt, &id, &slot);
	if (!s)
		return NULL;
	in->id = id;
	in->v = h + 1;
	in->end = data_end;
	in->mask = worker_bit(widx, &word);
	in->word = word;
	in->now = bpf_ktime_get_ns();
	return s;
}

/* sg_user_check is the outcome of a reply before it is reduced (under s->lock). */
static __always_inline int sg_user_check(const struct sg_slot *s, const struct sg_user_in *in)
{
	if (s->res.req_id != in->id || s->res.group != in->gid)
		return G_STALE;
	if (s->state != SG_SLOT_PENDING)
		return G_LATE;
	if (s->res.bitmap[in->word & (SG_BITMAP_WORDS - 1)] & in->mask)
		return G_DUP;
	return G_REDUCED;
}

/* sg_user_end counts the reply's outcome and returns its verdict (outside the lock). */
static __always_inline int sg_user_end(int outcome, struct sg_slot *s, const struct sg_user_in *in)
{
	if (outcome == G_USER_REFUSED) {
		COUNT(in->cnt, user_refused);
		return XDP_DROP;
	}
	return gather_finish(outcome, s, in->g, in->cnt);
}

/* SG_USER_REDUCTION makes the XDP program name of the reduction fn (see above). */
#define SG_USER_REDUCTION(name, fn)                                                        \
	SEC("xdp")                                                                          \
	int name(struct xdp_md *ctx)                                                        \
	{                                                                                   \
		struct sg_user_in in = {};                                                  \
		struct sg_slot *s = sg_user_begin(ctx, &in);                                \
		__u16 flags_before;                                                         \
		int outcome;                                                                \
                                                                                            \
		if (!s)                                                                     \
			return XDP_DROP;                                                    \
		bpf_spin_lock(&s->lock);                                                    \
		outcome = sg_user_check(s, &in);                                            \
		if (outcome == G_REDUCED) {                                                 \
			flags_before = s->res.flags;                                        \
			if (fn(&s->res, in.g, in.v, in.end))                                \
				outcome = G_USER_REFUSED;                                   \
			else                                                                \
				outcome = answered(s, in.word & (SG_BITMAP_WORDS - 1),      \
						   in.mask, in.now) |                       \
					  overflowed(s, flags_before);                      \
		}                                                                           \
		bpf_spin_unlock(&s->lock);                                                  \
		return sg_user_end(outcome, s, &in);                                        \
	}

#endif /* KEDGE_SG_USER_H */
