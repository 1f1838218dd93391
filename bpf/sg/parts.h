/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* parts.h - XDP ingress: replies of more than one datagram (nparts > 1), reduced per part.
 *
 * Part p of a worker's reply carries the elements [p * k, min((p + 1) * k, elems)) with
 * k = ceil(elems / nparts) (bpf/include/sg.h); it is reduced into the slot's accumulators
 * at that offset as it arrives, so nothing is buffered. Which parts of which worker
 * arrived is kept in the parts map, one entry per (slot, worker), written only under the
 * slot's lock and only by this path: single-packet replies never look at it. A worker has
 * answered (bitmap, count, completion) when its last part arrives.
 * Checks after gather()'s (magic ... registered worker), the first that fails decides:
 *   group takes parts (SG_GF_PARTS, not GATHER), its entry exists
 *                                           else passed (multipart)
 *   nparts <= SG_PARTS_MAX, part < nparts, the part's slice non-empty, payload length its
 *   slice's bytes ......................... else passed (bad_parts)
 *   status 0 .............................. else dropped (worker_errors)
 *   slot holds this full request id ....... else dropped (stale)
 *   slot still pending .................... else dropped (late)
 *   worker not yet answered in full, part not yet arrived
 *                                           else dropped (part_dups)
 *   nparts as in the worker's earlier parts of this request
 *                                           else dropped (part_mismatch)
 * A single-packet reply of a worker that has parts of this request in the aggregate is
 * dropped (part_mismatch) by gather(): the one lookup of this map a single packet makes,
 * only in groups with SG_GF_PARTS. */
#ifndef KEDGE_SG_PARTS_H
#define KEDGE_SG_PARTS_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "counters.h"
#include "sg.h"
#include "maps.h"
#include "reply.h"

/* parts_entry is the parts-map entry of (slot, worker widx) of group g, or NULL when the
 * slot is outside the group's range or the map was not sized for it. */
static __always_inline struct sg_parts *parts_entry(const struct sg_group *g, __u32 slot, __u32 widx)
{
	__u32 rel = slot - g->slot_base, key;

	if (rel >= g->nslots)
		return NULL;
	key = g->part_base + rel * g->nworkers + widx;
	return bpf_map_lookup_elem(&parts, &key);
}

/* parts_first starts the accumulators of a MIN/MAX request at the identity when a part is
 * the first contribution (a part covers only its slice, so "the first reply sets them" does
 * not hold per element). Runs under s->lock. */
static __always_inline void parts_first(struct sg_slot *s, const struct sg_group *g)
{
	__s64 id;

	s->res.flags |= SG_F_PARTS;
	if (s->res.count || (g->reduce != SG_RED_MIN && g->reduce != SG_RED_MAX))
		return; /* a whole reply set every element already; or a sum or count */
	id = g->reduce == SG_RED_MIN ? 0x7fffffffffffffffLL : (-0x7fffffffffffffffLL - 1);
	for (__u32 i = 0; i < SG_AGG_ELEMS; i++) {
		if (i >= g->elems)
			break;
		s->res.agg[i] = id;
	}
}

static __always_inline int gather_part(struct sg_hdr *h, void *data_end, const struct sg_group *g,
				       struct sg_stats *cnt, __u32 gid, __u32 widx, __u32 plen)
{
	__u32 nparts = bpf_ntohs(h->nparts), part = bpf_ntohs(h->part);
	__u32 off = 0, n = 0, k, slot, word, pbit, full;
	struct sg_parts *e;
	struct sg_slot *s;
	__u64 id, mask, now;
	__u16 flags_before;
	int outcome;

	if (!(g->flags & SG_GF_PARTS) || g->reduce == SG_RED_GATHER) {
		COUNT(cnt, multipart);
		return XDP_PASS;
	}
	if (nparts > SG_PARTS_MAX || part >= nparts) {
		COUNT(cnt, bad_parts);
		return XDP_PASS;
	}
	if (g->reduce != SG_RED_COUNT) {
		__u32 size = g->dtype == SG_T_I64 ? 8 : 4;
		__u64 len;

		k = (g->elems + nparts - 1) / nparts;
		off = part * k;
		if (off >= g->elems) { /* empty: nparts too large for the vector */
			COUNT(cnt, bad_parts);
			return XDP_PASS;
		}
		n = g->elems - off < k ? g->elems - off : k;
		len = plen;
		barrier_var(len); /* as in gather(): a 64-bit bound 6.1 keeps */
		if (len != (__u64)n * size || len > SG_AGG_BYTES) {
			COUNT(cnt, bad_parts);
			return XDP_PASS;
		}
		if ((void *)(h + 1) + len > data_end) {
			COUNT(stats_for(NO_GROUP), malformed);
			return XDP_PASS;
		}
	}
	s = reply_slot(h, g, cnt, &id, &slot);
	if (!s)
		return XDP_DROP;
	e = parts_entry(g, slot, widx);
	if (!e) { /* the parts map was not sized for this group */
		COUNT(cnt, multipart);
		return XDP_PASS;
	}
	mask = worker_bit(widx, &word);
	pbit = 1U << (part & (SG_PARTS_MAX - 1));
	full = (__u32)((1ULL << nparts) - 1);
	now = bpf_ktime_get_ns();

	bpf_spin_lock(&s->lock);
	if (s->res.req_id != id || s->res.group != gid) {
		outcome = G_STALE;
	} else if (s->state != SG_SLOT_PENDING) {
		outcome = G_LATE;
	} else if (s->res.bitmap[word] & mask) {
		outcome = G_PART_DUP; /* the worker has answered in full */
	} else {
		if (e->req_id != id || !e->bits) { /* an earlier request's entry: take it over */
			e->req_id = id;
			e->bits = 0;
			e->nparts = nparts;
		}
		if (e->nparts != nparts) {
			outcome = G_PART_MISMATCH;
		} else if (e->bits & pbit) {
			outcome = G_PART_DUP;
		} else {
			flags_before = s->res.flags;
			if (!(flags_before & SG_F_PARTS))
				parts_first(s, g);
			if (g->reduce != SG_RED_COUNT) {
				if (g->dtype == SG_T_I64)
					reduce_i64(s, g->reduce, off, n, h + 1, data_end);
				else
					reduce_i32(s, g->reduce, off, n, h + 1, data_end);
			}
			if (!e->bits)
				s->res.partial++;
			e->bits |= pbit;
			outcome = G_PART;
			if (e->bits == full) {
				s->res.partial--;
				outcome = answered(s, word, mask, now);
			}
			outcome |= overflowed(s, flags_before);
		}
	}
	bpf_spin_unlock(&s->lock);
	if ((outcome & 0xff) <= G_COMPLETED || (outcome & 0xff) == G_PART)
		COUNT(cnt, parts);
	return gather_finish(outcome, s, g, cnt);
}

#endif /* KEDGE_SG_PARTS_H */
