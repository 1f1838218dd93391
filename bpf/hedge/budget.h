/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* budget.h - how many hedges a service may send (docs/hedging.md, Budget).
 *
 * The splitter calls budget_request() for every request and budget_reserve() before it
 * clones (or stores) one; whoever sends a hedge calls budget_charge() right before it
 * leaves (refused: no hedge, budget_exhausted) - each hedge of a request on its own -,
 * budget_refund() when a charged hedge could not be sent, and budget_release() when a
 * reservation ends unhedged. Two modes (svc_cfg.budget_mode):
 *
 *  BUDGET_WINDOW (the window, what kedge defaults to with the stored path): every request
 *    is cloned (or stored); a hedge is charged when it is sent,
 *    if hedges over the last BUDGET_SLOTS slots stay within ratio x requests over those
 *    slots + burst. Waiting and answered requests hold nothing, and a stall's requests are
 *    covered by the whole window's requests, not by a bucket of burst tokens. A hedge is
 *    sent only if, counting it, hedges <= ratio x requests + burst over the window's slots
 *    (the last BUDGET_SLOTS - 1 to BUDGET_SLOTS slot lengths); docs/hedging.md has what
 *    that bounds over a stretch and over a run.
 *  BUDGET_BUCKET: each request deposits ratio tokens while fewer than burst are free; the
 *    splitter's clone takes a token (none: no clone, budget_exhausted), a hedge keeps it,
 *    a clone dropped unhedged gives it back. Over any run, hedges <= ratio x requests +
 *    burst. */
#ifndef KEDGE_HEDGE_BUDGET_H
#define KEDGE_HEDGE_BUDGET_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "hedge.h"
#include "maps.h"

/* A hedge's cost in the bucket's milli-tokens (tokens_milli, budget_ratio_milli). */
#define HEDGE_MILLI 1000

/* A window slot's length when user space set none (the fixtures' objects). */
#define BUDGET_SLOT_DEFAULT_NS 1000000000ULL

/* win_slot returns the window slot of now, starting it over (zeroed) when it last served
 * an older slot of time; *epoch is now's slot index in time. Two CPUs starting the same
 * slot at once may lose a count or two of the slot's first moments: a budget, not a ledger. */
static __always_inline __u32 win_slot(struct svc_cfg *sc, struct svc_state *st, __u64 now, __u64 *epoch)
{
	__u64 slot_ns = sc->budget_slot_ns ? sc->budget_slot_ns : BUDGET_SLOT_DEFAULT_NS;
	__u64 e = now / slot_ns + 1, old;
	__u32 i = e % BUDGET_SLOTS;

	barrier_var(i);
	if (i >= BUDGET_SLOTS)
		i = 0;
	old = st->win_epoch[i];
	if (old != e && __sync_val_compare_and_swap(&st->win_epoch[i], old, e) == old) {
		__sync_lock_test_and_set(&st->win_requests[i], 0);
		__sync_lock_test_and_set(&st->win_hedges[i], 0);
	}
	*epoch = e;
	return i;
}

/* win_sums adds up the requests and hedges of the slots inside the window ending at epoch. */
static __always_inline void win_sums(struct svc_state *st, __u64 epoch, __u64 *req, __u64 *hedges)
{
	for (__u32 i = 0; i < BUDGET_SLOTS; i++) {
		__u64 e = st->win_epoch[i];

		if (e && e <= epoch && e + BUDGET_SLOTS > epoch) {
			*req += st->win_requests[i];
			*hedges += st->win_hedges[i];
		}
	}
}

/* budget_request: a request was seen (the splitter, before budget_reserve). */
static __always_inline void budget_request(struct svc_cfg *sc, struct svc_state *st, __u64 now)
{
	__u64 epoch;
	__u32 i;

	if (sc->budget_mode == BUDGET_BUCKET) {
		if (st->tokens_milli < (__s64)sc->budget_cap_milli)
			__sync_fetch_and_add(&st->tokens_milli, sc->budget_ratio_milli);
		return;
	}
	i = win_slot(sc, st, now, &epoch);
	__sync_fetch_and_add(&st->win_requests[i], 1);
}

/* budget_reserve: may this request be cloned into the delay line? The bucket takes the
 * hedge's token now (1) or refuses (0); the window reserves nothing: every request is
 * cloned and its hedge is charged, or refused, when it is due (budget_charge). */
static __always_inline int budget_reserve(struct svc_cfg *sc, struct svc_state *st)
{
	if (sc->budget_mode != BUDGET_BUCKET)
		return 1;
	if (__sync_fetch_and_add(&st->tokens_milli, -HEDGE_MILLI) >= HEDGE_MILLI)
		return 1;
	__sync_fetch_and_add(&st->tokens_milli, HEDGE_MILLI);
	return 0;
}

/* budget_release: a clone that took a bucket token was dropped without a hedge. The token
 * goes back uncapped: it was deposited before, so the bound stays exact. */
static __always_inline void budget_release(struct svc_cfg *sc, struct svc_state *st)
{
	if (sc->budget_mode == BUDGET_BUCKET)
		__sync_fetch_and_add(&st->tokens_milli, HEDGE_MILLI);
}

/* budget_charge: a due clone is about to become a hedge. The bucket's token pays (1); the
 * window charges the hedge to now's slot if hedges over the window stay within ratio x
 * requests + burst (1), else refuses (0). Added first and taken back on refusal, so two
 * CPUs cannot both pass on the last hedge. */
static __always_inline int budget_charge(struct svc_cfg *sc, struct svc_state *st, __u64 now)
{
	__u64 epoch, req = 0, hedges = 0;
	__u32 i;

	if (sc->budget_mode == BUDGET_BUCKET)
		return 1;
	i = win_slot(sc, st, now, &epoch);
	__sync_fetch_and_add(&st->win_hedges[i], 1);
	win_sums(st, epoch, &req, &hedges);
	if (hedges * HEDGE_MILLI <= req * sc->budget_ratio_milli + sc->budget_cap_milli)
		return 1;
	__sync_fetch_and_add(&st->win_hedges[i], -1);
	return 0;
}

/* budget_refund: a charged hedge could not be sent after all (rewrite or redirect failed):
 * the window takes it back from now's slot; the bucket's token goes back. */
static __always_inline void budget_refund(struct svc_cfg *sc, struct svc_state *st, __u64 now)
{
	__u64 epoch;
	__u32 i;

	if (sc->budget_mode == BUDGET_BUCKET) {
		__sync_fetch_and_add(&st->tokens_milli, HEDGE_MILLI);
		return;
	}
	i = win_slot(sc, st, now, &epoch);
	if (st->win_hedges[i])
		__sync_fetch_and_add(&st->win_hedges[i], -1);
}

#endif /* KEDGE_HEDGE_BUDGET_H */
