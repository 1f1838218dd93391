/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* stored.h - the stored request of a group with SG_GF_RESEND (struct sg_stored, key slot):
 * what the scatter keeps of a request for its re-sends (resend.h) and what replies read of
 * it.
 *
 *   stored_request        the scatter (bpf_loop tier), before the copies: the frame as the
 *                         coordinator sent it, the budget's deposit, the first round's due
 *                         time, then a pacer tick asked for it (docs/pacer.md: store before
 *                         the request)
 *   stored_first_replica  the scatter, per copy (groups with replicas): its replica
 *   stored_reply          the gather, per reply to a re-sent worker: a second reply is a
 *                         late reply (dropped, late_replies), a first one from another
 *                         replica than the first copy's is a hedge won; per first reply of
 *                         a worker that was not re-sent: a sample of the delay estimate
 *   quantile_up           the tick, per worker re-sent for the first time in a round that
 *                         began at or after the delay estimate: a sample above it
 * The entry belongs to the request whose id it holds; a newer request in the slot takes it
 * over, and nothing clears it when a request completes. */
#ifndef KEDGE_SG_STORED_H
#define KEDGE_SG_STORED_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "clock.h"
#include "counters.h"
#include "parse.h"
#include "sg.h"
#include "maps.h"
#include "reply.h"
#include "pacer_client.h"

#ifndef READ_ONCE
#define READ_ONCE(x) (*(volatile typeof(x) *)&(x))
#endif

/* The stored frame's buffer (struct sg_stored.data): a power of two, so a length is bounded
 * with a mask. */
#define SG_STORE_SPAN (SG_STORE_BYTES + SG_CSUM_CHUNK)
_Static_assert((SG_STORE_SPAN & (SG_STORE_SPAN - 1)) == 0, "sg_stored.data: a power of two");
_Static_assert(sizeof(((struct sg_stored *)0)->data) == SG_STORE_SPAN, "sg_stored.data's size");

/* span_len bounds a length already checked to be 1..span (a power of two) for the
 * verifier, in the form of the hedger's store_len and the pacer echo's echo_len: the same
 * number, with a minimum of 1 and a maximum of span that every matrix verifier derives from
 * the mask. clang folds "len < a || len > b" into one subtract-and-compare on a copy of
 * len, and a clamp "if (n > b) n = b" into a compare of another copy, so the register
 * handed to the helper keeps none of the bounds on 6.1 (bpf_skb_load_bytes "R3 min value
 * is outside of the allowed memory range", bpf_csum_diff "R4 unbounded memory access")
 * nor its minimum on 6.12 (bpf_skb_store_bytes "R4 invalid zero-sized read"). The barrier
 * keeps clang from dropping the mask for the range its own compares proved. */
static __always_inline __u32 span_len(__u32 len, const __u32 span)
{
	barrier_var(len);
	return ((len - 1) & (span - 1)) + 1;
}

/* stored_len: a frame length checked to be 1..SG_STORE_BYTES, bounded (span_len). */
static __always_inline __u32 stored_len(__u32 len)
{
	return span_len(len, SG_STORE_SPAN);
}

/* rep_word: the word of worker i's 2-bit replica index in rep_first/rep_last; *shift its
 * place in it. */
static __always_inline __u32 rep_word(__u32 i, __u32 *shift)
{
	__u32 w = i / 32;

	barrier_var(w);
	*shift = (i % 32) * 2;
	return w & (SG_REP_WORDS - 1);
}

static __always_inline __u32 rep_get(const __u64 *words, __u32 i)
{
	__u32 shift, w = rep_word(i, &shift);

	return (__u32)(words[w] >> shift) & (SG_REPLICAS_MAX - 1);
}

static __always_inline void rep_set(__u64 *words, __u32 i, __u32 r)
{
	__u32 shift, w = rep_word(i, &shift);

	words[w] = (words[w] & ~((__u64)(SG_REPLICAS_MAX - 1) << shift)) | ((__u64)r << shift);
}

/* stored_first_replica notes the replica worker i's first copy of the slot's request went
 * to (its last copy's, too, until a re-send). Global: the scatter's per-copy callback makes
 * one call, where inlined its branches took the bpf_loop tier's scatter from 80,573 to
 * 117,174 instructions verified on 6.18. Returns 0. */
__attribute__((noinline)) int stored_first_replica(__u32 slot, __u32 i, __u32 r)
{
	struct sg_stored *st = bpf_map_lookup_elem(&stored, &slot);

	if (!st)
		return 0;
	rep_set(st->rep_first, i, r);
	rep_set(st->rep_last, i, r);
	return 0;
}

/* budget_deposit: a request of nworkers copies pays into its group's re-send budget. */
static __always_inline void budget_deposit(const struct sg_group *g, struct sg_budget *b)
{
	if (READ_ONCE(b->tokens_milli) < (__s64)g->budget_cap_milli)
		__sync_fetch_and_add(&b->tokens_milli, (__s64)g->budget_ratio_milli * g->nworkers);
}

/* budget_take: one re-sent copy, paid (1) or refused (0), leaving at least keep milli-copies
 * saved. Taken first and given back on refusal, so two CPUs cannot both spend the last
 * copy. */
static __always_inline int budget_take(struct sg_budget *b, __s64 keep)
{
	if (__sync_fetch_and_add(&b->tokens_milli, -SG_COPY_MILLI) >= SG_COPY_MILLI + keep)
		return 1;
	__sync_fetch_and_add(&b->tokens_milli, SG_COPY_MILLI);
	return 0;
}

/* quantile_late_max: how many of a request's workers lie above the q quantile of reply
 * times in the ordinary case, at most: 2 + 4 x nworkers x (1 - q), rounded down (two more
 * than four times the average; see quantile_claim_up). Without an estimate (q 0) more
 * than nworkers. */
static __always_inline __u32 quantile_late_max(const struct sg_group *g)
{
	return 2 + g->nworkers * (1000 - g->resend_quantile_milli) / 250;
}

/* budget_keep: what a re-send leaves in the budget, the round's sent-th copy (from 0), a
 * hedge (hedge: to another replica of its shard) or a retry (the same worker again). A
 * worker's first re-send may spend the last copy, except two kinds: a repeat (its earlier re-send
 * unanswered too), and a retry past the round's first quantile_late_max, leave what lies
 * below half the cap. A worker that answers no copy for rounds on end is most often a
 * whole host stalled, where repeats buy nothing; without the reserve one such request's
 * rounds (up to resend_max x nworkers copies) empty the budget, and with few requests in
 * flight nothing refills it before the next request's lost copy is refused in every round
 * and times out. A round that finds more workers silent than a request lacks in the
 * ordinary case is a request late as a whole (a worker host descheduled): retried to the
 * same host its copies buy nothing either, and at fan-out 64 a few such rounds emptied the
 * budget for the lost copies after them (docs/sg.md, Tail). Hedged to another replica they
 * do: a first hedge is held back by nothing but the budget itself (held back past the
 * round's first quantile_late_max, the straggle p99 at fan-out 64 read 1.15x).
 * The bound stays ratio x copies + cap: the reserve only orders who may spend. */
static __always_inline __s64 budget_keep(const struct sg_group *g, int again, __u32 sent, int hedge)
{
	return again || (!hedge && sent >= quantile_late_max(g)) ? (__s64)(g->budget_cap_milli / 2) : 0;
}

static __always_inline void budget_refund(struct sg_budget *b)
{
	__sync_fetch_and_add(&b->tokens_milli, SG_COPY_MILLI);
}

/* The quantile estimate moves by 1/2^QUANTILE_SHIFT of itself per sample (hist.h's
 * median_step uses the same rate), up by q and down by 1 - q of that, so it settles where
 * a fraction q of the samples lie below it. */
#define QUANTILE_SHIFT 5

/* quantile_step: estimate m of the q_milli/1000 quantile after a sample of ns; the first
 * sample (m 0) sets it. Stored without a lock: a racing update loses a step. */
static __always_inline __u64 quantile_step(__u64 m, __u64 ns, __u32 q_milli)
{
	__u64 step = (m >> QUANTILE_SHIFT) + 1, up, down;

	if (!ns)
		ns = 1;
	if (!m)
		return ns;
	up = step * q_milli / 1000 + 1;
	down = step * (1000 - q_milli) / 1000 + 1;
	if (ns > m)
		return m + up;
	if (ns < m)
		return m > down ? m - down : 1;
	return m;
}

/* Re-sent workers are censored samples of the estimate. stored_reply steps it only with
 * workers that were not re-sent (a re-sent worker's first reply may answer either copy), but
 * a worker re-sent elapsed ns after the scatter is known to take longer than elapsed. When
 * elapsed had reached the estimate as the round began, that sample lies above it: the tick
 * steps the estimate up once for each worker it re-sends for the first time (quantile_up),
 * as a slower reply would. (Before the estimate, its side is unknown: no step.) Without
 * this the estimate would see only the replies that beat their re-send and drift down to
 * where the replies between a round's due time and the tick that sends it balance it: the
 * quicker the ticks, the lower the delay and the more re-sends.
 *
 * quantile_censors: whether a round at now of a request scattered at sent censors above the
 * estimate: whether the estimate's time after the scatter is due by the pacer's measure
 * (pacer_due: its early margin, half a pass on the conveyor, counts as on time). A round
 * the conveyor delivered early is a round at its due time; were it left out, the re-sends
 * of every early tick would go unsampled and the estimate would drift down again (a model
 * with ticks +-50 us about their due time: 4.1% of the copies re-sent at q 0.98 comparing
 * with now, 1.95% comparing with the due time). */
static __always_inline int quantile_censors(const struct sg_group *g, const struct sg_budget *b, __u64 sent,
					    __u64 now)
{
	__u64 m = READ_ONCE(b->delay_ns);

	return g->resend_quantile_milli && m && sent && pacer_due(sent + m, now, 0);
}

/* One request's samples are not independent: its replies come from the same hosts at the
 * same moment, so a request slow as a whole (a worker host descheduled, a queue behind
 * another request) gives all its samples above the estimate at once, and at 3% of the
 * estimate per step up (q 0.98) 64 of them multiply it by 6.9, where the steps down (0.06%
 * each) take about 50 requests of 64 copies to bring it back: the delay wanders up, and
 * every straggler meanwhile is hedged late. So a request counts at most
 * 2 + 4 x nworkers x (1 - q) samples above the estimate, rounded down (replies and first
 * re-sends together): two more than four times what it counts on average at the quantile,
 * nworkers x (1 - q); the samples below it all count. The two: a request's replies are not independent in the
 * ordinary case either (a worker host answers its shards one after the other, so a
 * request's last replies are its slowest), and with the one more of an earlier limit,
 * 1 + 2 x nworkers x (1 - q), a request of 16 counted one sample above (q 0.98), the
 * estimate settled lower (median 359-540 us against 577-1,076 us without a limit) and the
 * rounds re-sent 6% of the copies where 1% were lost (docs/sg.md, Tail).
 *
 * quantile_claim_up: whether the request stored in st may count one more sample above.
 * Read, then added to without fetching: the gather calls it on 5.10 too, whose verifier
 * refuses an atomic that returns the old value ("BPF_STX uses reserved fields"; 5.12+).
 * Two replies racing past the limit count one sample more. */
static __always_inline int quantile_claim_up(struct sg_stored *st, const struct sg_group *g)
{
	if (READ_ONCE(st->ups) >= quantile_late_max(g))
		return 0;
	__sync_fetch_and_add(&st->ups, 1);
	return 1;
}

/* quantile_up: the estimate after a sample above it. */
static __always_inline void quantile_up(struct sg_budget *b, __u32 q_milli)
{
	__u64 m = READ_ONCE(b->delay_ns);

	if (m)
		b->delay_ns = quantile_step(m, m + 1, q_milli);
}

/* resend_delay: how long after the scatter (and after a round) the next round is due: the
 * group's fixed resend_ns, or its quantile estimate clamped to [resend_min_ns,
 * resend_ns]. */
static __always_inline __u64 resend_delay(const struct sg_group *g, const struct sg_budget *b)
{
	__u64 d = READ_ONCE(b->delay_ns);

	if (!g->resend_quantile_milli || !d)
		return g->resend_ns;
	if (d < g->resend_min_ns)
		d = g->resend_min_ns;
	return d < g->resend_ns ? d : g->resend_ns;
}

/* resend_again_delay: how long after a round the next one is due. With replicas and the
 * adaptive delay, half of resend_delay, at least resend_min_ns: the estimate is a quantile
 * of reply times within a whole scatter, each worker answering its copy behind the
 * request's others on its host, where a hedge travels alone to a replica the request left
 * idle and is answered in a fraction of that, so waiting a whole delay again for it only
 * lengthens the requests whose hedge was slow too (at fan-out 64 with 1% stragglers, 2% of
 * the requests took a second round: most of the p99; docs/sg.md, Tail benchmark). Retries
 * (no replicas) and the fixed delay keep their rounds resend_delay apart. */
static __always_inline __u64 resend_again_delay(const struct sg_group *g, const struct sg_budget *b)
{
	__u64 d = resend_delay(g, b);

	if (!(g->flags & SG_GF_REPLICAS) || !g->resend_quantile_milli)
		return d;
	d /= 2;
	return d > g->resend_min_ns ? d : g->resend_min_ns;
}

/* stored_request (scatter, bpf_loop tier, before the first copy is rewritten) stores the
 * request id of slot slot: its frame from the Ethernet header, l4_off the UDP header's
 * offset. A frame longer than SG_STORE_BYTES is not stored (resend_unstored) and never
 * re-sent. The entry's due time is written last, with an atomic exchange, so that a tick
 * that sees it finds the rest. Global: verified once, on its own. Returns 0. */
__attribute__((noinline)) int stored_request(struct __sk_buff *skb, __u32 gid, __u32 slot, __u64 id,
					     __u32 l4_off)
{
	struct sg_stored *st = bpf_map_lookup_elem(&stored, &slot);
	struct sg_group *g = bpf_map_lookup_elem(&groups, &gid);
	struct sg_budget *b = bpf_map_lookup_elem(&budgets, &gid);
	struct sg_stats *cnt = stats_for(gid < SG_GROUPS_MAX ? gid : NO_GROUP);
	__u32 len = skb->len, ck = l4_off + offsetof(struct udphdr, check);
	__u64 now = kedge_now(), due;

	if (!st || !g || !b) {
		COUNT(cnt, resend_unstored);
		return 0;
	}
	__sync_lock_test_and_set(&st->due_ns, 0);
	st->req_id = id;
	st->sent_ns = now;
	st->rounds = 0;
	st->ups = 0;
	__builtin_memset(st->resent, 0, sizeof(st->resent));
	if (len < 1 || len > SG_STORE_BYTES || ck + 2 > len ||
	    bpf_skb_load_bytes(skb, 0, st->data, stored_len(len)) < 0) {
		st->len = 0;
		COUNT(cnt, resend_unstored);
		return 0;
	}
	st->len = len;
	/* Zeroes for the checksum (resend.h sums whole words from the UDP header on, and
	 * computes the checksum field anew). */
	barrier_var(ck);
	if (ck < SG_STORE_BYTES) {
		st->data[ck] = 0;
		st->data[ck + 1] = 0;
	}
	if (len <= SG_STORE_BYTES) {
		st->data[len] = 0;
		st->data[len + 1] = 0;
		st->data[len + 2] = 0;
		st->data[len + 3] = 0;
	}
	budget_deposit(g, b);
	due = now + resend_delay(g, b);
	__sync_lock_test_and_set(&st->due_ns, due);
	pacer_request(skb, due);
	return 0;
}

/* stored_reply (gather, a reply of a group with SG_GF_RESEND for worker who & 0xffff of
 * slot's request id, outcome its enum gather_outcome; who >> 16: 1 + the replica it came
 * from, 0 without replicas - five arguments at most): 1 when it is a re-sent worker's
 * second reply (counted late_replies: the caller drops it); a first reply of a re-sent
 * worker from another replica than its first copy's counts hedges_won; a first reply of a
 * worker that was not re-sent steps the group's delay estimate (resend_quantile_milli)
 * with its time since the scatter. Global: the gather's verifier states stay as they
 * were. */
__attribute__((noinline)) int stored_reply(__u32 slot, __u64 id, __u32 who, __u32 gid, int outcome)
{
	__u32 widx = who & 0xffff, rep = who >> 16;
	struct sg_stored *st = bpf_map_lookup_elem(&stored, &slot);
	struct sg_stats *cnt = stats_for(gid < SG_GROUPS_MAX ? gid : NO_GROUP);
	__u32 word = (widx / 64) & (SG_BITMAP_WORDS - 1);
	struct sg_group *g;
	struct sg_budget *b;
	__u64 now, sent, m;

	if (!st || READ_ONCE(st->req_id) != id)
		return 0;
	if (READ_ONCE(st->resent[word]) & (1ULL << (widx & 63))) {
		if (outcome == G_DUP) {
			COUNT(cnt, late_replies);
			return 1;
		}
		if ((outcome == G_REDUCED || outcome == G_COMPLETED) && rep &&
		    rep - 1 != rep_get(st->rep_first, widx))
			COUNT(cnt, hedges_won);
		return 0;
	}
	if (outcome != G_REDUCED && outcome != G_COMPLETED)
		return 0;
	g = bpf_map_lookup_elem(&groups, &gid);
	b = bpf_map_lookup_elem(&budgets, &gid);
	sent = READ_ONCE(st->sent_ns);
	now = kedge_now();
	if (!g || !b || !g->resend_quantile_milli || !sent || now <= sent)
		return 0;
	m = READ_ONCE(b->delay_ns);
	if (m && now - sent > m && !quantile_claim_up(st, g))
		return 0;
	b->delay_ns = quantile_step(m, now - sent, g->resend_quantile_milli);
	return 0;
}

#endif /* KEDGE_SG_STORED_H */
