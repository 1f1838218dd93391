/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* maps.h - kedge sg's configuration and the maps only its own programs use (sg_maps.h has
 * the ones user reductions share). */
#ifndef KEDGE_SG_MAPS_H
#define KEDGE_SG_MAPS_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "counters.h"
#include "marks.h"
#include "sg.h"
#include "sg_maps.h"

/* Set by user space before load (internal/sg.Load); the defaults are what it sets when not
 * told otherwise. */
const volatile struct sg_config sg_cfg = {
	.copy_mark = KEDGE_MARK_SG_COPY,
	.cont_mark = KEDGE_MARK_SG_CONT,
	.batch = 64,
	.first_batch = 8,
};

/* Referenced so that these types reach the object's BTF (bpf2go -type, TestWireMatchesBTF). */
const enum kedge_mark *sg_btf_mark __attribute__((unused));
const enum sg_wire *sg_btf_wire __attribute__((unused));
const enum sg_limits *sg_btf_limits __attribute__((unused));
const enum sg_group_flags *sg_btf_group_flags __attribute__((unused));
const enum sg_result_flags *sg_btf_result_flags __attribute__((unused));
const enum sg_op *sg_btf_op __attribute__((unused));
const enum sg_reduce *sg_btf_reduce __attribute__((unused));
const enum sg_dtype *sg_btf_dtype __attribute__((unused));
const enum sg_status *sg_btf_status __attribute__((unused));
const enum sg_replica_choice *sg_btf_replica_choice __attribute__((unused));
const enum sg_slot_state *sg_btf_slot_state __attribute__((unused));
const struct sg_hdr *sg_btf_hdr __attribute__((unused));

/* Every group's workers, group g's at [worker_base, worker_base + nworkers). Sized for one
 * full group per group id; user space adds room past that for the further replicas of
 * shards (struct sg_shard.key). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SG_GROUPS_MAX * SG_WORKERS_MAX);
	__type(key, __u32);
	__type(value, struct sg_worker);
} workers SEC(".maps");

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

/* Shards with replicas (struct sg_shard; key replica_base + worker index of a group with
 * SG_GF_REPLICAS). User space sizes it (the workers of the groups with replicas; 1 when
 * there are none) before load. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sg_shard);
} replicas SEC(".maps");

/* Re-sends (SG_GF_RESEND, resend.h): the stored request of each slot (struct sg_stored, key
 * slot). User space sizes it (SG_SLOTS when a group re-sends; 1 when none does) before
 * load. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sg_stored);
} stored SEC(".maps");

/* Each group's re-send budget (struct sg_budget). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SG_GROUPS_MAX);
	__type(key, __u32);
	__type(value, struct sg_budget);
} budgets SEC(".maps");


/* User reductions (SG_RED_USER): the program of group g at key g, put there by user space
 * (internal/sg.Objects.SetUserReduction) before the group is enabled; the gather
 * tail-calls it (gather.h). */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, SG_GROUPS_MAX);
	__type(key, __u32);
	__type(value, __u32);
} sg_user_progs SEC(".maps");

#endif /* KEDGE_SG_MAPS_H */
