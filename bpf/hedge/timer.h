/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* timer.h - latency and precision histograms, and the periodic work of a bpf_timer
 * (softirq): the adaptive delay (a quantile of the service's latency window) and
 * scoreboard expiry. */
#ifndef KEDGE_HEDGE_TIMER_H
#define KEDGE_HEDGE_TIMER_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "clock.h"
#include "counters.h"
#include "proto.h"
#include "hist.h"
#include "hedge.h"
#include "maps.h"
#include "budget.h"
#include "replica.h"

#define NS_PER_US 1000ULL
#define PER_MILLE 1000

static __always_inline void hist_add(void *map, __u32 idx, __u64 us)
{
	struct khist *h = bpf_map_lookup_elem(map, &idx);
	__u32 b = hist_bucket(us, HIST_SUB_BITS, HIST_MIN_SHIFT, HIST_BUCKETS);

	/* hist_bucket() clamps, so clang would drop this check; older verifiers (6.1) need it. */
	barrier_var(b);
	if (h && b < HIST_BUCKETS)
		__sync_fetch_and_add(&h->b[b], 1);
}

/* Records a request latency in the current slot and in the running total. */
static __always_inline void record_latency(__u32 svc, struct svc_state *st, __u64 ns)
{
	__u32 base = svc * (HIST_SLOTS + 1);
	__u32 slot = st->slot;

	if (slot >= HIST_SLOTS)
		slot = 0;
	hist_add(&lat_hist, base + slot, ns / NS_PER_US);
	hist_add(&lat_hist, base + HIST_SLOTS, ns / NS_PER_US);
	__sync_fetch_and_add(&st->window_count, 1);
}

/* Records how late (or early) a hedge left against its deadline. */
static __always_inline void record_precision(__u32 svc, __u64 now, __u64 deadline)
{
	if (now >= deadline)
		hist_add(&dl_precision, svc * 2, (now - deadline) / NS_PER_US);
	else
		hist_add(&dl_precision, svc * 2 + 1, (deadline - now) / NS_PER_US);
}

/* Bucket index -> upper edge in microseconds (the last bucket's is finite: 2^28 us). */
static __always_inline __u64 bucket_upper_us(__u32 b)
{
	return hist_lower(b + 1, HIST_SUB_BITS, HIST_MIN_SHIFT);
}

/* Plain bounded loops, not bpf_loop callbacks: a callback that accumulates into its
 * context never converges in the verifier (each sum is a new state). */
static __always_inline __u64 hist_count(struct khist *h)
{
	__u64 n = 0;

	for (__u32 i = 0; i < HIST_BUCKETS; i++)
		n += h->b[i];
	return n;
}

static __always_inline __u32 hist_quantile_bucket(struct khist *h, __u64 target)
{
	__u64 seen = 0;

	for (__u32 i = 0; i < HIST_BUCKETS; i++) {
		seen += h->b[i];
		if (seen >= target)
			return i;
	}
	return HIST_BUCKETS - 1;
}

/* Moves the expiring slot's counts out of the running total (xchg: no lost increments). */
static __always_inline void hist_drain(struct khist *old, struct khist *total)
{
	for (__u32 i = 0; i < HIST_BUCKETS; i++) {
		__u32 n = __sync_lock_test_and_set(&old->b[i], 0);

		if (n)
			__sync_fetch_and_sub(&total->b[i], n);
	}
}

/* tick_service ages the service's replica estimates (replica.h); for an adaptive service it
 * then sets the delay to the quantile of its window and rotates the window by one slot. */
static long tick_service(__u32 svc, void *unused)
{
	struct svc_cfg *sc;
	struct svc_state *st;
	struct khist *total, *old;
	__u32 base, next, idx;
	__u64 count, d;

	if (svc >= SVC_MAX)
		return 1;
	sc = bpf_map_lookup_elem(&svc_cfgs, &svc);
	st = bpf_map_lookup_elem(&svc_states, &svc);
	if (!sc || !st || !sc->enabled)
		return 0;
	replica_age(sc, st);
	if (sc->mode != DELAY_QUANTILE)
		return 0;
	base = svc * (HIST_SLOTS + 1);
	idx = base + HIST_SLOTS;
	total = bpf_map_lookup_elem(&lat_hist, &idx);
	if (!total)
		return 0;

	/* The quantile over the window, clamped; too few samples keep the current delay. */
	count = hist_count(total);
	st->window_count = count;
	if (count > 0 && count >= sc->min_samples) {
		/* quantile_pm per mille of the samples, rounded up; the bucket's upper edge in ns */
		d = bucket_upper_us(hist_quantile_bucket(total, (count * sc->quantile_pm + PER_MILLE - 1) / PER_MILLE)) * NS_PER_US;
		if (d < sc->min_ns)
			d = sc->min_ns;
		if (d > sc->max_ns)
			d = sc->max_ns;
		sc->delay_ns = d;
		st->last_delay_ns = d;
	}

	/* Rotate: the oldest slot leaves the window. */
	next = st->slot + 1;
	if (next >= HIST_SLOTS)
		next = 0;
	idx = base + next;
	old = bpf_map_lookup_elem(&lat_hist, &idx);
	if (old)
		hist_drain(old, total);
	st->slot = next;
	return 0;
}

struct gc_ctx {
	__u64 now;
};

/* Counts through the stats map, not the context: a counter in the context would make every
 * iteration a distinct verifier state. */
static long gc_one(void *map, struct hreq_key *key, struct hreq *r, struct gc_ctx *ctx)
{
	__u32 svc = key->svc;
	struct svc_cfg *sc;
	struct svc_state *st;

	/* An entry written after this walk read its clock (a splitter on the other CPU) is
	 * younger than now: the unsigned difference would wrap and delete a live request. */
	if (r->sent_ns >= ctx->now || ctx->now - r->sent_ns <= cfg.ttl_ns)
		return 0;
	/* PENDING or ANSWERED past the TTL (at least twice the delay): its clone never came
	 * back out of the delay line (a qdisc dropped it), so its bucket token goes back here. */
	if (r->state == REQ_PENDING || r->state == REQ_ANSWERED) {
		sc = bpf_map_lookup_elem(&svc_cfgs, &svc);
		st = bpf_map_lookup_elem(&svc_states, &svc);
		if (sc && st)
			budget_release(sc, st);
	}
	bpf_map_delete_elem(map, key);
	COUNT(stats_global(), gc_expired);
	return 0;
}

static int on_tick(void *map, __u32 *key, struct hedge_tick *t)
{
	struct gc_ctx g = { .now = kedge_now() };

	bpf_loop(SVC_MAX, tick_service, NULL, 0);
	bpf_for_each_map_elem(&scoreboard, gc_one, &g, 0);
	bpf_timer_start(&t->timer, cfg.tick_ns, 0);
	return 0;
}

/* timer_arm starts the periodic timer; returns 0 or the failing helper's error (positive). */
static __always_inline int timer_arm(void)
{
	__u32 zero = 0;
	struct hedge_tick *t = bpf_map_lookup_elem(&ticker, &zero);
	long err;

	if (!t)
		return 1;
	err = bpf_timer_init(&t->timer, &ticker, CLOCK_MONOTONIC);
	if (err && err != -EBUSY) /* already initialised */
		return (int)-err;
	err = bpf_timer_set_callback(&t->timer, on_tick);
	if (err)
		return (int)-err;
	return (int)-bpf_timer_start(&t->timer, cfg.tick_ns, 0);
}

#endif /* KEDGE_HEDGE_TIMER_H */
