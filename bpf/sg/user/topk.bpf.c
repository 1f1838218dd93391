// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* topk.bpf.c - a user reduction (bpf/include/sg_user.h; docs/sg.md, "User reductions"):
 * the K largest values any worker sent, in descending order.
 *
 * Each worker answers a vector of K values (the group's elems, int32 or int64: its own
 * candidates, in any order); the result's K accumulators are the K largest of all the
 * values the answering workers sent, largest first (duplicates kept). K is at most
 * TOPK_MAX, 8: the verifier walks every way the merge's K x K steps can go (40,798
 * instructions on 6.18 at 8, 233,344 at 16); a larger K is refused (user_refused).
 *
 * Built by `make generate` into internal/sg/testdata/topk_bpfel.o; a copy of this file is
 * the template for a reduction of one's own. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "sg_user.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define TOPK_MAX 8
#define INT64_MIN (-0x7fffffffffffffffLL - 1)

/* insert puts x into the k kept values acc[0..k), largest first, if it is larger than the
 * smallest: the smaller ones move one down, the last one out. Indexes are masked: the
 * verifier needs their bound where clang would otherwise walk a pointer. */
static __always_inline void insert(__s64 *acc, __u32 k, __s64 x)
{
	__u32 j = k - 1;

	if (x <= acc[j & (TOPK_MAX - 1)])
		return;
	for (__u32 n = 0; n < TOPK_MAX && j > 0; n++) {
		if (acc[(j - 1) & (TOPK_MAX - 1)] >= x)
			break;
		acc[j & (TOPK_MAX - 1)] = acc[(j - 1) & (TOPK_MAX - 1)];
		j--;
	}
	acc[j & (TOPK_MAX - 1)] = x;
}

static __always_inline int topk(struct sg_result *res, const struct sg_group *g, const void *v,
				const void *end)
{
	__s64 *acc = res->agg;
	__u32 k = g->elems;

	if (k == 0 || k > TOPK_MAX)
		return 1;
	if (res->count == 0) { /* the first reply: nothing kept yet */
		for (__u32 i = 0; i < TOPK_MAX && i < k; i++) {
			__u32 at = i;

			barrier_var(at);
			acc[at & (TOPK_MAX - 1)] = INT64_MIN;
		}
	}
	/* One loop per element type: a loop that branched on it per element would double
	 * the paths the verifier walks. */
	if (g->dtype == SG_T_I64) {
		const __be64 *e = v;

		for (__u32 i = 0; i < TOPK_MAX && i < k; i++) {
			if ((const void *)(e + i + 1) > end)
				return 1; /* cannot happen: the gather checked the length */
			insert(acc, k, (__s64)bpf_be64_to_cpu(e[i]));
		}
	} else {
		const __be32 *e = v;

		for (__u32 i = 0; i < TOPK_MAX && i < k; i++) {
			if ((const void *)(e + i + 1) > end)
				return 1;
			insert(acc, k, (__s32)bpf_ntohl(e[i]));
		}
	}
	return 0;
}

SG_USER_REDUCTION(sg_topk, topk)
