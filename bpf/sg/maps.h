/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* maps.h - kedge sg's maps, run-time constants and counter helpers. */
#ifndef KEDGE_SG_MAPS_H
#define KEDGE_SG_MAPS_H

#include "sg.h"

/* UAPI #defines vmlinux.h lacks. */
#define SG_CLOCK_MONOTONIC 1
#define SG_EBUSY 16

/* Set by user space before load. */
const volatile __u32 cfg_copy_mark = 0x6b530000; /* skb->mark on copies: not scattered again */
/* Copies per run of the scatter. A run's copies all land in the sending CPU's backlog
 * before the kernel delivers any of them (netdev_max_backlog, 1000 by default and not per
 * network namespace: a burst of 1024 overflows it). After a batch, the request is handed
 * on: marked cfg_cont_mark and redirected to the group interface's ingress, where
 * sg_scatter_cont sends the next batch once the backlog has delivered this one. */
const volatile __u32 cfg_batch = 64;
/* The first run sends only this many copies (at most cfg_batch), and each later run as many
 * as have been sent so far, up to cfg_batch (8, 8, 16, 32, 64, 64, ...): the backlog
 * delivers the first copies to their workers while the next runs are made, instead of
 * after the first hop of a whole batch of 64 (docs/sg.md, "Batches"). */
const volatile __u32 cfg_first_batch = 8;
const volatile __u32 cfg_cont_mark = 0x6b530001; /* skb->mark of a request handed on */
/* The expiry timer fires this long after the deadline at the latest: a deadline that is
 * this close counts as reached (bpf_timer lateness, kernel-notes). */
const volatile __u64 cfg_expire_slack_ns = 0;

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SG_GROUPS_MAX);
	__type(key, __u32);
	__type(value, struct sg_group);
} groups SEC(".maps");

/* Every group's workers, group g's at [worker_base, worker_base + nworkers). Sized for one
 * full group per group id. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SG_GROUPS_MAX * SG_WORKERS_MAX);
	__type(key, __u32);
	__type(value, struct sg_worker);
} workers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SG_SLOTS);
	__type(key, __u32);
	__type(value, struct sg_slot);
} slots SEC(".maps");

/* Multi-packet replies: which parts of each (slot, worker) arrived (struct sg_parts; gather
 * key part_base + (slot - slot_base) * nworkers + worker). An array, so entries are never
 * allocated or freed: an entry belongs to the request whose id it holds, and a newer
 * request in the slot takes it over. User space sizes it (nslots x nworkers of the groups
 * with SG_GF_PARTS; 1 when there are none) before load. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sg_parts);
} parts SEC(".maps");

/* Completed requests. 4 MiB hold ~1800 results (2.4 KiB each), more than the SG_SLOTS
 * that can complete before user space frees a slot only when it is read... so a full
 * ring means user space stopped reading; the slot then keeps the result (ringbuf_full). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 << 20);
} results SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SG_GROUPS_MAX + 1);
	__type(key, __u32);
	__type(value, struct sg_stats);
} stats SEC(".maps");

/* Evaluates st once: a second lookup would be unchecked. */
#define COUNT(st, field) do { typeof(st) __c = (st); if (__c) __c->field++; } while (0)
#define COUNT_N(st, field, n) do { typeof(st) __c = (st); if (__c) __c->field += (n); } while (0)

static __always_inline struct sg_stats *stats_for(__u32 group)
{
	return bpf_map_lookup_elem(&stats, &group);
}

#define NO_GROUP SG_GROUPS_MAX

static __always_inline int addr_eq(const struct in6_addr *a, const struct in6_addr *b)
{
	return a->in6_u.u6_addr32[0] == b->in6_u.u6_addr32[0] &&
	       a->in6_u.u6_addr32[1] == b->in6_u.u6_addr32[1] &&
	       a->in6_u.u6_addr32[2] == b->in6_u.u6_addr32[2] &&
	       a->in6_u.u6_addr32[3] == b->in6_u.u6_addr32[3];
}

/* emit_result sends a completed slot's result to user space. The slot is DONE, so no
 * other program writes it until user space has read the result and reuses the slot.
 * flags: 0 (the ring wakes its reader) or BPF_RB_NO_WAKEUP (SG_GF_WAKE_SOCKET: the
 * completing reply, passed to the coordinator socket, wakes it). */
static __always_inline void emit_result(struct sg_slot *s, struct sg_stats *cnt, __u64 flags)
{
	if (bpf_ringbuf_output(&results, &s->res, sizeof(s->res), flags) < 0)
		COUNT(cnt, ringbuf_full);
}

#endif /* KEDGE_SG_MAPS_H */
