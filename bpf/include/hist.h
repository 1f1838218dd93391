/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* hist.h: log-linear histogram buckets (HdrHistogram's layout), shared by every capability
 * that keeps latency histograms in a map, and a running median (median_step, at the end).
 * internal/hist is the histograms' Go mirror; the fixtures in internal/hist/histtest run
 * those functions through BPF_PROG_TEST_RUN and compare them with the Go code value by value.
 *
 * A layout has three parameters:
 *   sub_bits   2^sub_bits buckets per power of two (each at most 2^-sub_bits of its lower
 *              edge wide: 3 -> 12.5 %, 4 -> 6.25 %)
 *   min_shift  values below 2^min_shift fall into 2^sub_bits linear buckets of width
 *              2^(min_shift - sub_bits) (min_shift >= sub_bits; equal: one bucket per value)
 *   buckets    number of buckets; the last one also holds every larger value
 * Bucket b covers [hist_lower(b), hist_lower(b + 1)):
 *   b <  2^sub_bits:  [b, b + 1) << (min_shift - sub_bits)
 *   b >= 2^sub_bits:  g = b >> sub_bits, s = b & (2^sub_bits - 1), e = min_shift + g - 1:
 *                     [2^sub_bits + s, 2^sub_bits + s + 1) << (e - sub_bits)
 * so the octave [2^e, 2^(e+1)) for e >= min_shift is buckets (e - min_shift + 1) << sub_bits
 * and the 2^sub_bits after it. Layouts in use: pping (ns, 3, 8, PP_HIST_BINS), hedge.
 *
 * The functions take the layout as arguments and are always inlined: with constants, as
 * every caller passes them, the compiler folds the layout away. */
#ifndef KEDGE_HIST_H
#define KEDGE_HIST_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

/* floor(log2(v)) for v > 0, without loops (a binary search over the bits). */
static __always_inline __u32 hist_log2(__u64 v)
{
	__u32 e = 0;

	if (v >> 32) {
		v >>= 32;
		e += 32;
	}
	if (v >> 16) {
		v >>= 16;
		e += 16;
	}
	if (v >> 8) {
		v >>= 8;
		e += 8;
	}
	if (v >> 4) {
		v >>= 4;
		e += 4;
	}
	if (v >> 2) {
		v >>= 2;
		e += 2;
	}
	if (v >> 1)
		e += 1;
	return e;
}

/* The bucket of value v. */
static __always_inline __u32 hist_bucket(__u64 v, __u32 sub_bits, __u32 min_shift,
					 __u32 buckets)
{
	__u32 e, b;

	if (v < (1ULL << min_shift)) {
		b = v >> (min_shift - sub_bits);
	} else {
		e = hist_log2(v);
		b = ((e - min_shift + 1) << sub_bits) +
		    (__u32)((v >> (e - sub_bits)) & ((1ULL << sub_bits) - 1));
	}
	return b < buckets ? b : buckets - 1;
}

/* The smallest value of bucket b (the inverse of hist_bucket() on bucket edges). */
static __always_inline __u64 hist_lower(__u32 b, __u32 sub_bits, __u32 min_shift)
{
	__u32 g = b >> sub_bits;
	__u64 s = b & ((1U << sub_bits) - 1);

	if (!g)
		return s << (min_shift - sub_bits);
	return ((1ULL << sub_bits) + s) << (min_shift + g - 1 - sub_bits);
}

/* The running median estimates (a replica's reply time in the hedger and in scatter-gather)
 * move by 1/2^MEDIAN_SHIFT of themselves per sample: a stochastic ("frugal") median in the
 * log domain. It settles where half the samples are above and follows a change by a factor F
 * within ln(F) x 2^MEDIAN_SHIFT samples. */
#define MEDIAN_SHIFT 5

/* median_step: the estimate m after a sample of ns (0 counts as 1); the first sample (m 0)
 * sets it. Callers store the result without a lock: racing updates lose a step (noise, not
 * error). */
static __always_inline __u64 median_step(__u64 m, __u64 ns)
{
	__u64 step = (m >> MEDIAN_SHIFT) + 1;

	if (!ns)
		ns = 1;
	if (!m)
		return ns;
	if (ns > m)
		return m + step;
	if (ns < m)
		return m > step ? m - step : 1;
	return m;
}

#endif /* KEDGE_HIST_H */
