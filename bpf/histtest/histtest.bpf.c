// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* histtest: exposes hist.h to BPF_PROG_TEST_RUN. One run fills every entry of the 'cases'
 * array: the bucket of its value and the lower edge of its bucket index, under the layout
 * user space set in 'layout' before loading. The fixtures in internal/hist/histtest compare
 * them with internal/hist. Not attached anywhere: it exists for tests.
 *
 * The layout is a run-time value here (the verifier sees constants, the compiler does not),
 * so one object tests any layout; users of hist.h pass compile-time constants. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "hist.h"

#define HISTTEST_CASES 256

struct hist_case {
	__u64 value; /* in */
	__u32 index; /* in: a bucket index */
	__u32 bucket; /* out: hist_bucket(value) */
	__u64 lower; /* out: hist_lower(index) */
};

struct hist_layout {
	__u32 sub_bits;
	__u32 min_shift;
	__u32 buckets;
};

const volatile struct hist_layout layout = {};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, HISTTEST_CASES);
	__type(key, __u32);
	__type(value, struct hist_case);
} cases SEC(".maps");

SEC("tc")
int hist_table(struct __sk_buff *skb)
{
	__u32 i, key;

	/* The key is a copy: the loop counter stays in a register, where the verifier can bound
	 * it (through the stack slot it loses track and reports an infinite loop). */
#pragma clang loop unroll(disable)
	for (i = 0; i < HISTTEST_CASES; i++) {
		struct hist_case *c;

		key = i;
		c = bpf_map_lookup_elem(&cases, &key);

		if (!c)
			return 2; /* TC_ACT_SHOT: cannot happen for an array */
		c->bucket = hist_bucket(c->value, layout.sub_bits, layout.min_shift, layout.buckets);
		c->lower = hist_lower(c->index, layout.sub_bits, layout.min_shift);
	}
	return 0;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
