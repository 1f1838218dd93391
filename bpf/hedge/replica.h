/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* replica.h - which replica a hedge goes to (docs/hedging.md, Replica choice), and the
 * per-replica latency estimate that choice by p50 reads.
 *
 *   pick_replica     the rescuer, for each hedge: an untried replica, or REPLICA_NONE
 *   replica_observe  the response path: replica idx answered after ns (first responses and
 *                    the dropped duplicates alike: the loser's latency is what shows a
 *                    replica slow)
 *   replica_overdue  the response path: replica idx has not answered a copy sent ns ago (a
 *                    censored sample: raises its estimate when ns is above it)
 *   replica_age      the timer, every tick: an estimate with no fresh sample halves, so a
 *                    replica avoided for being slow is tried again
 *
 * The estimate is a stochastic ("frugal") median (Ma, Muthukrishnan, Sandler 2013) in the
 * log domain: each sample above the estimate raises it by 1/32 of itself, each below lowers
 * it by as much, so it settles where half the samples are above (the median), within a few
 * steps' noise, and follows a change by a factor F within ln(F) x 32 samples (74 for 10x).
 * One u64 per replica, one compare and add per response; no histogram, nothing to scan.
 * Updates race across CPUs by design (a lost step is noise, not error). */
#ifndef KEDGE_HEDGE_REPLICA_H
#define KEDGE_HEDGE_REPLICA_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "hedge.h"
#include "maps.h"

/* Referenced so the enum's BTF reaches bpf2go (-type replica_choice). */
const enum replica_choice *hedge_btf_replica_choice __attribute__((unused));

/* The estimate moves by 1/2^P50_SHIFT of itself per sample. */
#define P50_SHIFT 5

/* rep_bound bounds a replica index for the verifier. */
static __always_inline __u32 rep_bound(__u32 i)
{
	barrier_var(i);
	return i & (REPLICA_MAX - 1);
}

/* pick_replica returns a replica index not in tried (bit i: replica i already has the
 * request; the address the client used is set for the first hedge), or REPLICA_NONE when
 * every replica has it. A service with one address hedges to that address whatever tried
 * says (the thesis setting: a hedge to the same server; max_hedges bounds how often).
 *   REPLICA_RR:  round robin over the untried replicas, so each gets an equal share.
 *   REPLICA_P50: the untried replica with the lowest estimate; one without an estimate yet
 *                (0: cold) is lowest, so every replica is tried. Ties go to the first
 *                from a start that rotates with each pick. */
static __always_inline __u32 pick_replica(struct svc_cfg *sc, struct svc_state *st, __u32 tried)
{
	__u32 n = sc->nreplicas, untried = 0, start, k, seen = 0, best = REPLICA_NONE;
	__u64 best_ns = ~0ULL;

	if (n <= 1)
		return 0;
	if (n > REPLICA_MAX)
		n = REPLICA_MAX;
	for (__u32 i = 0; i < REPLICA_MAX; i++)
		if (i < n && !(tried & (1u << i)))
			untried++;
	if (!untried)
		return REPLICA_NONE;
	start = st->rr++; /* racy across CPUs by design: spreading, not counting */
	if (sc->replica_choice == REPLICA_P50) {
		for (__u32 j = 0; j < REPLICA_MAX; j++) {
			__u32 i = (start + j) % n;
			__u64 v;

			if (j >= n || tried & (1u << i))
				continue;
			v = st->rep_p50_ns[rep_bound(i)];
			if (v < best_ns)
				best_ns = v, best = i;
		}
		return best;
	}
	k = start % untried;
	for (__u32 i = 0; i < REPLICA_MAX; i++) {
		if (i >= n || tried & (1u << i))
			continue;
		if (seen++ == k)
			return i;
	}
	return REPLICA_NONE; /* not reached: k < untried */
}

/* replica_observe: replica idx (the response's source) answered ns after the copy sent to
 * it left. The first sample sets the estimate; later ones step it. */
static __always_inline void replica_observe(struct svc_cfg *sc, struct svc_state *st, __u32 idx, __u64 ns)
{
	__u64 m, step;

	if (idx >= sc->nreplicas || idx >= REPLICA_MAX)
		return;
	idx = rep_bound(idx);
	if (!ns)
		ns = 1;
	m = st->rep_p50_ns[idx];
	step = (m >> P50_SHIFT) + 1;
	if (!m)
		m = ns;
	else if (ns > m)
		m += step;
	else if (ns < m)
		m = m > step ? m - step : 1;
	st->rep_p50_ns[idx] = m;
	__sync_fetch_and_add(&st->rep_samples[idx], 1);
}

/* replica_overdue: a copy sent to replica idx ns ago has no answer yet, while another
 * replica's came. Its latency is above ns: when ns is above the estimate that is a sample
 * above it (a step up); otherwise it says nothing. A cold replica starts at ns. Not a
 * fresh sample for replica_age: an unanswering replica keeps ageing down and is tried
 * again, which is how it is seen to have come back. */
static __always_inline void replica_overdue(struct svc_cfg *sc, struct svc_state *st, __u32 idx, __u64 ns)
{
	__u64 m;

	if (idx >= sc->nreplicas || idx >= REPLICA_MAX)
		return;
	idx = rep_bound(idx);
	m = st->rep_p50_ns[idx];
	if (!m)
		st->rep_p50_ns[idx] = ns ? ns : 1;
	else if (ns > m)
		st->rep_p50_ns[idx] = m + (m >> P50_SHIFT) + 1;
}

/* replica_age (every timer tick): an estimate that got no sample since the last tick halves
 * (ticks are 3 s by default), so a replica avoided for being slow is picked again once it
 * looks faster than the others - within log2(its estimate / theirs) ticks - and its fresh
 * samples decide from there. */
static __always_inline void replica_age(struct svc_cfg *sc, struct svc_state *st)
{
	for (__u32 i = 0; i < REPLICA_MAX; i++) {
		if (i >= sc->nreplicas)
			break;
		if (__sync_lock_test_and_set(&st->rep_samples[i], 0) == 0)
			st->rep_p50_ns[i] >>= 1;
	}
}

#endif /* KEDGE_HEDGE_REPLICA_H */
