/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* events.h - the optional event stream (kedge hedge run -F json|jsonl): one event per hedge
 * sent, per first response of a hedged request (won or lost) and per due hedge refused, into
 * the ring buffer hedge_events. Off (hedge_config.events 0) the verifier drops the code, and
 * nothing is reserved; on, a full ring loses events, never packets. */
#ifndef KEDGE_HEDGE_EVENTS_H
#define KEDGE_HEDGE_EVENTS_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "hedge.h"
#include "maps.h"

/* hedge_event emits an event about request key (entry e) of service svc. */
static __always_inline void hedge_event(__u8 type, const struct hreq_key *key, const struct hreq *e,
					__u8 replica, __u8 reason, __u64 now)
{
	struct hedge_event *ev;

	if (!cfg.events)
		return;
	ev = bpf_ringbuf_reserve(&hedge_events, sizeof(*ev), 0);
	if (!ev)
		return;
	__builtin_memset(ev, 0, sizeof(*ev));
	ev->time_ns = now;
	ev->latency_ns = now > e->sent_ns ? now - e->sent_ns : 0;
	ev->caddr = key->caddr;
	ev->cport = key->cport;
	ev->id = key->id;
	ev->svc = key->svc;
	ev->type = type;
	ev->replica = replica;
	ev->hedges = e->hedges_sent;
	ev->reason = reason;
	bpf_ringbuf_submit(ev, 0);
}

#endif /* KEDGE_HEDGE_EVENTS_H */
