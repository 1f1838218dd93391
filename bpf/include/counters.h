/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* counters.h - kedge's one counter macro.
 *
 * Every program keeps its counters in a per-CPU array (BPF_MAP_TYPE_PERCPU_ARRAY) whose value
 * is a struct of named __u64 fields, one per outcome or reason (every drop, skip and helper
 * failure has its own); user space sums the CPUs' copies. A program looks the value up once
 * and passes the pointer on, NULL included: COUNT does the check, so a counter update is one
 * line wherever it happens and a missing map entry never faults.
 *
 *   struct foo_stats *s = bpf_map_lookup_elem(&foo_counters, &zero);
 *   COUNT(s, malformed);
 *   COUNT_N(s, copies, n);
 *   COUNT(s, drop[reason & (FOO_DROP_SLOTS - 1)]);
 *
 * Plain (non-atomic) increments: a per-CPU value is written only by programs on its own
 * CPU, and kedge's programs (TC, XDP, bpf_timer callbacks, all in softirq or with bottom
 * halves off) do not interrupt one another on a CPU. st is evaluated once: a second lookup
 * in the argument would be unchecked (older verifiers do not know that an array lookup with
 * a constant in-range key is non-NULL). */
#ifndef KEDGE_COUNTERS_H
#define KEDGE_COUNTERS_H

#define COUNT_N(st, field, n)                   \
	do {                                    \
		typeof(st) __cnt = (st);        \
		if (__cnt)                      \
			__cnt->field += (n);    \
	} while (0)

#define COUNT(st, field) COUNT_N(st, field, 1)

#endif /* KEDGE_COUNTERS_H */
