/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* expire.h - requests that are not complete by their deadline complete in the kernel.
 *
 * Kernels with bpf_loop (5.17+, so bpf_timer too): every slot has a bpf_timer, initialised
 * once by sg_timers_init (run through BPF_PROG_TEST_RUN at start, retried: on 6.18 a
 * burst of bpf_timer_init can fail with -ENOMEM) and re-armed by the scatter for each
 * request. Re-arming replaces the previous expiry, so a completed request's timer needs no
 * cancel: when it fires it finds the slot DONE or holding a newer request with a later
 * deadline, and does nothing.
 * Older kernels: sg_sweep walks every slot with a bounded loop; user space runs it through
 * BPF_PROG_TEST_RUN every few milliseconds (and the library's own deadline backs it). */
#ifndef KEDGE_SG_EXPIRE_H
#define KEDGE_SG_EXPIRE_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "counters.h"
#include "proto.h"
#include "sg.h"
#include "maps.h"

/* expire_slot completes s with SG_ST_TIMEOUT when it is pending and its deadline has
 * passed. Returns 1 when it did. */
static __always_inline int expire_slot(struct sg_slot *s, __u64 now)
{
	struct sg_stats *cnt;
	int fire = 0;
	__u16 group;

	bpf_spin_lock(&s->lock);
	if (s->state == SG_SLOT_PENDING && now + sg_cfg.expire_slack_ns >= s->deadline_ns) {
		s->state = SG_SLOT_DONE;
		s->res.status = SG_ST_TIMEOUT;
		s->res.done_ns = now;
		fire = 1;
	}
	group = s->res.group;
	bpf_spin_unlock(&s->lock);
	if (!fire)
		return 0;
	cnt = stats_for(group < SG_GROUPS_MAX ? group : NO_GROUP);
	COUNT(cnt, timeouts);
	emit_result(s, cnt, 0); /* no packet to wake the reader: the ring does */
	return 1;
}

static int expire_cb(void *map, __u32 *key, struct sg_slot *arg)
{
	__u64 now = bpf_ktime_get_ns();
	__u32 k = *key;
	struct sg_slot *s;
	__u64 deadline;

	/* Look the slot up again: 6.1's verifier gives the callback's value argument no id,
	 * and then refuses bpf_spin_unlock on it ("without taking a lock"). */
	s = bpf_map_lookup_elem(&slots, &k);
	if (!s)
		return 0;

	if (expire_slot(s, now))
		return 0;
	/* Fired before a deadline (should not happen: the scatter re-arms with the newest):
	 * arm again for what is left. */
	bpf_spin_lock(&s->lock);
	deadline = s->state == SG_SLOT_PENDING ? s->deadline_ns : 0;
	bpf_spin_unlock(&s->lock);
	if (deadline > now)
		bpf_timer_start(&s->timer, deadline - now, 0);
	return 0;
}

static __always_inline void arm_expiry(struct sg_slot *s, __u64 timeout, struct sg_stats *cnt)
{
	if (bpf_timer_start(&s->timer, timeout, 0) < 0)
		COUNT(cnt, timer_errors);
}

static long timer_init_cb(__u64 i, void *ctx)
{
	__u32 key = (__u32)i;
	__u32 *failed = ctx;
	struct sg_slot *s = bpf_map_lookup_elem(&slots, &key);
	long err;

	if (!s)
		return 1;
	err = bpf_timer_init(&s->timer, &slots, CLOCK_MONOTONIC);
	if (err == 0 || err == -EBUSY)
		err = bpf_timer_set_callback(&s->timer, expire_cb);
	if (err) {
		/* -ENOMEM: the timer allocator's per-CPU cache is empty until its refill
		 * (irq_work) runs; stop here and let user space run us again. */
		*failed = SG_SLOTS - key;
		return 1;
	}
	return 0;
}

#endif /* KEDGE_SG_EXPIRE_H */
