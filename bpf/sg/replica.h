/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* replica.h - shards with replicas (groups with SG_GF_REPLICAS, struct sg_shard): which
 * replica a copy goes to, and the judgement that takes a replica out of the rotation.
 *
 *   shard_pick      the scatter, per copy: the replica of shard i for this request
 *   shard_answered  the gather, per reply: is the source one of shard i's replicas (and
 *                   that replica is alive)
 *
 * Choice: round robin by request, (req_id / SG_SLOTS + i) mod nreplicas, so consecutive
 * requests go to consecutive replicas and one request's copies are spread over them; a
 * replica that is ejected is skipped for the next one after it. Or (SG_RC_LATENCY, as the
 * hedger's p50 choice) the replica not ejected with the lowest estimated median reply time,
 * which every reply from it steps (shard_observe); one without an estimate is lowest. Nothing is written per
 * choice but the replica's unanswered_ns, and that only when it is 0.
 * Judgement (as the hedger's, docs/hedging.md, with no counter to keep): a replica whose
 * first copy since its last reply is judge_ns old (the group's timeout: that request has
 * expired) is ejected for eject_base_ns << level (at most eject_max_ns), judged when it is
 * next a candidate. Back from its back-off it is a candidate again, and one more copy left
 * unanswered for judge_ns ejects it for twice as long; any reply from it resets it.
 * Times are kedge_now()'s, so a fixture fixes them. */
#ifndef KEDGE_SG_REPLICA_H
#define KEDGE_SG_REPLICA_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "clock.h"
#include "counters.h"
#include "hist.h"
#include "parse.h"
#include "sg.h"
#include "maps.h"

#ifndef READ_ONCE
#define READ_ONCE(x) (*(volatile typeof(x) *)&(x))
#endif

/* rep_bound bounds a replica index for the verifier. */
static __always_inline __u32 rep_bound(__u32 r)
{
	barrier_var(r);
	return r & (SG_REPLICAS_MAX - 1);
}

/* shard_eject takes replica r out for its back-off (the group's eject_base_ns << its level,
 * at most eject_max_ns). */
static __always_inline void shard_eject(struct sg_shard *sh, __u32 r, __u64 now, const struct sg_group *g)
{
	__u32 lvl = sh->level[r];
	__u64 backoff;

	if (lvl > SG_EJECT_LEVEL_MAX)
		lvl = SG_EJECT_LEVEL_MAX;
	backoff = g->eject_base_ns << lvl;
	if (backoff > g->eject_max_ns || backoff < g->eject_base_ns)
		backoff = g->eject_max_ns;
	sh->out_until_ns[r] = now + backoff;
	sh->level[r] = lvl + 1;
	sh->unanswered_ns[r] = 0; /* judged anew from its next copy */
}

/* A replica as shard_pick and shard_next return it: its workers-map key in the low
 * REP_KEY_BITS bits (the map holds fewer entries), its index in the shard above them. */
#define REP_KEY_BITS 24
#define REP_KEY_MASK ((1U << REP_KEY_BITS) - 1)

static __always_inline __u32 rep_key(int picked)
{
	return (__u32)picked & REP_KEY_MASK; /* -1: a key no entry has */
}

static __always_inline __u32 rep_index(int picked)
{
	return ((__u32)picked >> REP_KEY_BITS) & (SG_REPLICAS_MAX - 1);
}

static __always_inline int rep_picked(const struct sg_shard *sh, __u32 r)
{
	r = rep_bound(r);
	return (int)(sh->key[r] & REP_KEY_MASK) | (int)(r << REP_KEY_BITS);
}

/* shard_pick returns the replica of shard key (group gid: rep_key, rep_index) that gets
 * the copy of request rr (rr = req_id / SG_SLOTS + worker index) and notes the copy; -1
 * when the shard or the group is missing. Ejections and shards with every replica out are
 * counted here. A global function: the verifier checks its loop once, on its own, and the
 * scatter's rewrite after it sees one state (a key), not one per path through the
 * judgement. */
__attribute__((noinline)) int shard_pick(__u32 key, __u32 rr, __u64 now, __u32 gid)
{
	struct sg_shard *sh = bpf_map_lookup_elem(&replicas, &key);
	struct sg_group *g = bpf_map_lookup_elem(&groups, &gid);
	__u32 n, start, pick, found = 0;
	__u64 since, best = 0;

	if (!sh || !g)
		return -1;
	n = sh->nreplicas;
	if (n <= 1)
		return rep_picked(sh, 0);
	if (n > SG_REPLICAS_MAX)
		n = SG_REPLICAS_MAX;
	start = rr % n;
	pick = start;
	for (__u32 k = 0; k < SG_REPLICAS_MAX; k++) {
		__u32 r = start + k;
		__u64 v;

		if (k >= n)
			break;
		if (r >= n)
			r -= n;
		r = rep_bound(r);
		since = READ_ONCE(sh->unanswered_ns[r]);
		if (g->judge_ns && since && now - since >= g->judge_ns &&
		    READ_ONCE(sh->out_until_ns[r]) <= now) {
			shard_eject(sh, r, now, g);
			COUNT(stats_for(gid < SG_GROUPS_MAX ? gid : NO_GROUP), ejections);
		}
		if (READ_ONCE(sh->out_until_ns[r]) > now)
			continue;
		if (g->replica_choice != SG_RC_LATENCY) {
			pick = r;
			found = 1;
			break;
		}
		/* Lowest estimate; none yet (0) is lowest, so every replica is tried. */
		v = READ_ONCE(sh->p50_ns[r]);
		if (!found || v < best) {
			best = v;
			pick = r;
			found = 1;
		}
	}
	if (!found)
		COUNT(stats_for(gid < SG_GROUPS_MAX ? gid : NO_GROUP), shard_out);
	pick = rep_bound(pick);
	if (!READ_ONCE(sh->unanswered_ns[pick]))
		sh->unanswered_ns[pick] = now;
	return rep_picked(sh, pick);
}

/* shard_spare: whether shard key has more than one replica (a copy sent again goes to
 * another, a hedge, unless every other one is ejected: shard_next). */
static __always_inline int shard_spare(__u32 key)
{
	struct sg_shard *sh = bpf_map_lookup_elem(&replicas, &key);

	return sh && READ_ONCE(sh->nreplicas) > 1;
}

/* shard_next returns the replica of shard key that gets a copy sent again
 * (resend.h) after the last one went to replica last: the next one after it that is not
 * ejected, or last itself when there is none (a shard of one replica: a retry). It notes
 * the copy as shard_pick does; -1 when the shard is missing. Global, as shard_pick. */
__attribute__((noinline)) int shard_next(__u32 key, __u32 last, __u64 now)
{
	struct sg_shard *sh = bpf_map_lookup_elem(&replicas, &key);
	__u32 n, pick;

	if (!sh)
		return -1;
	n = sh->nreplicas;
	if (n > SG_REPLICAS_MAX)
		n = SG_REPLICAS_MAX;
	pick = rep_bound(last);
	for (__u32 k = 1; k < SG_REPLICAS_MAX; k++) {
		__u32 r = last + k;

		if (k >= n)
			break;
		if (r >= n)
			r -= n;
		r = rep_bound(r);
		if (READ_ONCE(sh->out_until_ns[r]) <= now) {
			pick = r;
			break;
		}
	}
	if (!READ_ONCE(sh->unanswered_ns[pick]))
		sh->unanswered_ns[pick] = now;
	return rep_picked(sh, pick);
}

/* shard_answered: a reply from saddr:sport claims to answer for shard sh. Returns 1 + the
 * replica's index when that is one of its replicas (and clears the replica's judgement
 * state), else 0. */
static __always_inline int shard_answered(struct sg_shard *sh, const struct in6_addr *saddr, __be16 sport)
{
	__u32 n = sh->nreplicas;

	for (__u32 r = 0; r < SG_REPLICAS_MAX; r++) {
		struct sg_worker *w;
		__u32 key;

		if (r >= n)
			break;
		key = sh->key[r];
		w = bpf_map_lookup_elem(&workers, &key);
		if (!w || w->port != sport || !in6_addr_eq(&w->addr, saddr))
			continue;
		/* Written only when set: every reply reads, few write. */
		if (READ_ONCE(sh->unanswered_ns[r]))
			sh->unanswered_ns[r] = 0;
		if (READ_ONCE(sh->level[r]))
			sh->level[r] = 0;
		return 1 + r;
	}
	return 0;
}

/* shard_observe: replica r of shard sh answered ns after its request left (hist.h's
 * running median, as the hedger's replicas). */
static __always_inline void shard_observe(struct sg_shard *sh, __u32 r, __u64 ns)
{
	r = rep_bound(r);
	sh->p50_ns[r] = median_step(READ_ONCE(sh->p50_ns[r]), ns);
}

#endif /* KEDGE_SG_REPLICA_H */
