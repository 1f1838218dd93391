// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* user_bad.bpf.c - objects internal/sg must refuse (user_test.go): a user reduction the
 * verifier rejects (it reads the payload without checking it against the packet's end),
 * and a program of the wrong type. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "sg_user.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

static __always_inline int unchecked(struct sg_result *res, const struct sg_group *g, const void *v,
				     const void *end)
{
	res->agg[0] += *(const __s64 *)v; /* no check against end */
	return 0;
}

SG_USER_REDUCTION(sg_unchecked, unchecked)

SEC("tc")
int sg_not_xdp(struct __sk_buff *skb)
{
	return 0;
}
