/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* clock.h - the one way a kedge program reads the time: kedge_now().
 *
 * In production kedge_now() is bpf_ktime_get_ns() (CLOCK_MONOTONIC): kedge_clock_fixed is a
 * read-only constant, false, and the verifier removes the branch, so the read costs what the
 * helper costs. A BPF_PROG_TEST_RUN fixture sets kedge_clock_fixed before loading
 * (bpftest.FixClock) and then writes the time each run must see into kedge_clock_ns
 * (bpftest.Runner.Clock, Case.Now): a clock-dependent case (a deadline just passed, an RTT
 * between two packets) is exact and needs no wall-clock margin or retry.
 *
 * Only reads through kedge_now() and kedge_jiffies() are fixed: bpf_timer callbacks still
 * fire on the kernel's clock, and timestamps the kernel writes itself (skb->tstamp on
 * receive) are its own.
 *
 * kedge_jiffies() is the coarse clock: bpf_jiffies64() (5.5), the kernel's tick count, for
 * per-packet bookkeeping that needs no precision (idle timeouts, "has a rate-limit interval
 * nearly passed"). It costs a memory read where bpf_ktime_get_ns() reads the clocksource
 * (tens of ns on a virtualised TSC: ~45 ns on the development VM). A program that needs
 * jiffies in nanoseconds is told the tick length by user space. With a fixed clock it
 * counts ticks of KEDGE_CLOCK_FIXED_JIFFY_NS (HZ 250) of kedge_clock_ns. */
#ifndef KEDGE_CLOCK_H
#define KEDGE_CLOCK_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

/* Set only by tests, before the object is loaded. */
const volatile bool kedge_clock_fixed = false;
/* The time, in nanoseconds, that kedge_now() returns while kedge_clock_fixed is set. */
volatile __u64 kedge_clock_ns = 0;

/* An enum so that bpf2go carries it to Go (-type kedge_clock_consts). */
enum kedge_clock_consts {
	KEDGE_CLOCK_FIXED_JIFFY_NS = 4000000,
};

static __always_inline __u64 kedge_now(void)
{
	if (kedge_clock_fixed)
		return kedge_clock_ns;
	return bpf_ktime_get_ns();
}

static __always_inline __u64 kedge_jiffies(void)
{
	if (kedge_clock_fixed)
		return kedge_clock_ns / KEDGE_CLOCK_FIXED_JIFFY_NS;
	return bpf_jiffies64();
}

#endif /* KEDGE_CLOCK_H */
