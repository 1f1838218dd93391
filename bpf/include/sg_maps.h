/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* sg_maps.h - the maps of kedge sg that user reductions (sg_user.h) share with its own
 * programs: internal/sg loads a user reduction with these maps replaced by the gather's,
 * so their definitions here are the one copy both objects are built from. */
#ifndef KEDGE_SG_MAPS_SHARED_H
#define KEDGE_SG_MAPS_SHARED_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "counters.h"
#include "sg.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SG_GROUPS_MAX);
	__type(key, __u32);
	__type(value, struct sg_group);
} groups SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SG_SLOTS);
	__type(key, __u32);
	__type(value, struct sg_slot);
} slots SEC(".maps");

/* Completed requests. 4 MiB hold ~1800 results (2.4 KiB each), more than the SG_SLOTS
 * that can complete before user space frees a slot only when it is read... so a full
 * ring means user space stopped reading; the slot then keeps the result (ringbuf_full). */
#define SG_RESULTS_BYTES (4 << 20)

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, SG_RESULTS_BYTES);
} results SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SG_GROUPS_MAX + 1);
	__type(key, __u32);
	__type(value, struct sg_stats);
} stats SEC(".maps");

static __always_inline struct sg_stats *stats_for(__u32 group)
{
	return bpf_map_lookup_elem(&stats, &group);
}

#define NO_GROUP SG_GROUPS_MAX

/* What the gather hands the user reduction it tail-calls (struct sg_user_call). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sg_user_call);
} sg_user_call SEC(".maps");

/* emit_result sends a completed slot's result to user space. The slot is DONE, so no
 * other program writes it until user space has read the result and reuses the slot.
 * flags: 0 (the ring wakes its reader) or BPF_RB_NO_WAKEUP (SG_GF_WAKE_SOCKET: the
 * completing reply, passed to the coordinator socket, wakes it). */
static __always_inline void emit_result(struct sg_slot *s, struct sg_stats *cnt, __u64 flags)
{
	if (bpf_ringbuf_output(&results, &s->res, sizeof(s->res), flags) < 0)
		COUNT(cnt, ringbuf_full);
}

#endif /* KEDGE_SG_MAPS_SHARED_H */
