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
#include "clock.h"
#include "hedge.h"
#include "hist.h"
#include "maps.h"

/* Referenced so the enum's BTF reaches bpf2go (-type replica_choice). */
const enum replica_choice *hedge_btf_replica_choice __attribute__((unused));

/* rep_bound bounds a replica index for the verifier. */
static __always_inline __u32 rep_bound(__u32 i)
{
	barrier_var(i);
	return i & (REPLICA_MAX - 1);
}

/* Replica judgement (docs/hedging.md, Replica judgement): a replica that has not answered its
 * last eject_after hedges, though the last of them left judge_ns ago, or whose median is
 * above the delay and slow_factor times the best other hedge target's, is ejected: it gets no
 * hedges for a back-off of eject_base_ns, doubled with each ejection in a row (up to
 * eject_max_ns). Back from it, one more unanswered hedge ejects it again, for longer; its
 * next response makes it good again. Only hedges are steered: the address the client used
 * is never changed.
 *
 *   replica_in       is replica i in at now (not ejected, or its back-off is over)
 *   replica_eject    eject it now (one ejection counted, on one CPU)
 *   replica_judge    the pick, per candidate: eject it if its last hedges went unanswered
 *   replica_sent     the hedge decision: a hedge left for replica i
 *   replica_answered the response path: replica i answered (good again) */
static __always_inline int replica_in(struct svc_state *st, __u32 i, __u64 now)
{
	return READ_ONCE(st->rep_out_until_ns[rep_bound(i)]) <= now;
}

static __always_inline int replica_eject(struct svc_cfg *sc, struct svc_state *st, __u32 i, __u64 now)
{
	__u64 old, backoff;
	__u32 lvl;

	i = rep_bound(i);
	old = READ_ONCE(st->rep_out_until_ns[i]);
	if (old > now || !sc->eject_base_ns)
		return 0;
	lvl = st->rep_level[i];
	if (lvl > EJECT_LEVEL_MAX)
		lvl = EJECT_LEVEL_MAX;
	backoff = sc->eject_base_ns << lvl;
	if (backoff > sc->eject_max_ns)
		backoff = sc->eject_max_ns;
	if (__sync_val_compare_and_swap(&st->rep_out_until_ns[i], old, now + backoff) != old)
		return 0; /* another CPU ejected it */
	st->rep_level[i] = lvl + 1;
	/* On probation when it is back: its next hedge unanswered ejects it again. */
	st->rep_unanswered[i] = sc->eject_after ? sc->eject_after - 1 : 0;
	__sync_fetch_and_add(&st->rep_ejections[i], 1);
	return 1;
}

static __always_inline int replica_judge(struct svc_cfg *sc, struct svc_state *st, __u32 i, __u64 now)
{
	i = rep_bound(i);
	if (!sc->eject_after || READ_ONCE(st->rep_unanswered[i]) < sc->eject_after)
		return 0;
	if (now < READ_ONCE(st->rep_judge_from_ns[i]) + sc->judge_ns)
		return 0; /* the last hedge may still be answered */
	return replica_eject(sc, st, i, now);
}

static __always_inline void replica_sent(struct svc_cfg *sc, struct svc_state *st, __u32 i, __u64 now)
{
	if (!sc->eject_after || i >= REPLICA_MAX)
		return;
	i = rep_bound(i);
	if (__sync_fetch_and_add(&st->rep_unanswered[i], 1) + 1 == sc->eject_after)
		st->rep_judge_from_ns[i] = now;
}

static __always_inline void replica_answered(struct svc_state *st, __u32 i)
{
	i = rep_bound(i);
	/* Written only when set: every response reads, few write (no line ping-pong). */
	if (READ_ONCE(st->rep_unanswered[i]))
		st->rep_unanswered[i] = 0;
	if (READ_ONCE(st->rep_level[i]))
		st->rep_level[i] = 0;
}

/* pick_replica returns a replica index not in tried (bit i: replica i already has the
 * request; the address the client used is set for the first hedge) and not ejected
 * (judged here first), REPLICA_OUT when every replica without the request is ejected, or
 * REPLICA_NONE when every replica has it. A service with one address hedges to that address
 * whatever tried says (the thesis setting: a hedge to the same server; max_hedges bounds
 * how often), and is not judged.
 *   REPLICA_RR:  round robin over the candidates, so each gets an equal share.
 *   REPLICA_P50: the candidate with the lowest estimate; one without an estimate yet
 *                (0: cold) is lowest, so every replica is tried. Ties go to the first
 *                from a start that rotates with each pick. */
static __always_inline __u32 pick_replica(struct svc_cfg *sc, struct svc_state *st, __u32 tried, __u64 now)
{
	__u32 n = sc->nreplicas, untried = 0, ncand = 0, start, k, seen = 0, best = REPLICA_NONE;
	__u64 best_ns = ~0ULL;

	if (n <= 1)
		return 0;
	if (n > REPLICA_MAX)
		n = REPLICA_MAX;
	/* Counted, not collected in a mask: a mask's 2^n values would each be a state of its
	 * own to the verifier. */
	for (__u32 i = 0; i < REPLICA_MAX; i++) {
		if (i >= n || (tried & (1u << i)))
			continue;
		untried++;
		replica_judge(sc, st, i, now);
		if (replica_in(st, i, now))
			ncand++;
	}
	if (!untried)
		return REPLICA_NONE;
	if (!ncand)
		return REPLICA_OUT;
	start = st->rr++; /* racy across CPUs by design: spreading, not counting */
	if (sc->replica_choice == REPLICA_P50) {
		for (__u32 j = 0; j < REPLICA_MAX; j++) {
			__u32 i = (start + j) % n;
			__u64 v;

			if (j >= n || tried & (1u << i) || !replica_in(st, i, now))
				continue;
			v = st->rep_p50_ns[rep_bound(i)];
			if (v < best_ns)
				best_ns = v, best = i;
		}
		return best < REPLICA_MAX ? best : REPLICA_OUT;
	}
	k = start % ncand;
	for (__u32 i = 0; i < REPLICA_MAX; i++) {
		if (i >= n || tried & (1u << i) || !replica_in(st, i, now))
			continue;
		if (seen++ == k)
			return i;
	}
	return REPLICA_OUT; /* a back-off began between the two loops */
}

/* pick_for is pick_replica for service svc: a global function, so the verifier checks the
 * judgement's loop once, on its own, not once per state of each caller (the tick's loop). */
__attribute__((noinline)) int pick_for(__u32 svc, __u32 tried, __u64 now)
{
	struct svc_cfg *sc = bpf_map_lookup_elem(&svc_cfgs, &svc);
	struct svc_state *st = bpf_map_lookup_elem(&svc_states, &svc);

	if (!sc || !st)
		return REPLICA_NONE;
	return pick_replica(sc, st, tried, now);
}

/* judge_slow: replica idx of service svc has median m (above the delay): ejected when that is
 * above slow_factor times the best other hedge target's (now: the response's time is close
 * enough; the back-off is what matters). The service's own address is no yardstick: every
 * request samples it, while a hedge target is sampled only when hedges are due - at the
 * moments something is slow - so its median reads high beside it even when it is as fast.
 * Runs only for a median above the delay, so rarely: a global function, so its loop is not
 * inlined into each response path that observes a replica. */
__attribute__((noinline)) int judge_slow(__u32 svc, __u32 idx, __u64 m)
{
	struct svc_cfg *sc = bpf_map_lookup_elem(&svc_cfgs, &svc);
	struct svc_state *st = bpf_map_lookup_elem(&svc_states, &svc);
	__u64 best = 0, v;

	if (!sc || !st)
		return 0;
	for (__u32 i = 0; i < REPLICA_MAX; i++) {
		if (i >= sc->nreplicas)
			break;
		v = st->rep_p50_ns[i];
		if (i != idx && i != sc->orig_index && v && (!best || v < best))
			best = v;
	}
	if (best && m > best * sc->slow_factor)
		return replica_eject(sc, st, idx, kedge_now());
	return 0;
}

/* replica_observe: replica idx (the response's source) answered ns after the copy sent to
 * it left. The first sample sets the estimate; later ones step it. */
static __always_inline void replica_observe(__u32 svc, struct svc_cfg *sc, struct svc_state *st, __u32 idx, __u64 ns)
{
	__u64 m;

	if (idx >= sc->nreplicas || idx >= REPLICA_MAX)
		return;
	idx = rep_bound(idx);
	m = median_step(st->rep_p50_ns[idx], ns);
	st->rep_p50_ns[idx] = m;
	__sync_fetch_and_add(&st->rep_samples[idx], 1);
	replica_answered(st, idx);
	if (sc->slow_factor && m > sc->delay_ns && idx != sc->orig_index)
		judge_slow(svc, idx, m);
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
		st->rep_p50_ns[idx] = m + (m >> MEDIAN_SHIFT) + 1;
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
