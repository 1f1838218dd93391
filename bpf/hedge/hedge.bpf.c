// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* hedge.bpf.c - the client side of kedge's transparent UDP request hedger: its entry points,
 * one call each into the stage that handles it. A request's path, top-down:
 *
 *   hedge_split  (TC egress, client iface)   split.h    record the request; store it for a
 *                                                       tick (store.h) or carry a clone
 *                                                       through the delay line (the pacer)
 *   hedge_rescue (TC ingress, pacer veth)    tick.h     the pacer's tick program: a tick pops
 *                                                       every due stored request, a clone
 *                                                       comes back; each due one is hedged
 *                                                       by send.h (claim, budget, build) and
 *                                                       sent; a clone not due goes round again
 *   hedge_resp   (TC ingress, client iface)  respond.h  first response wins; duplicates dropped
 *   hedge_arm    (BPF_PROG_TEST_RUN, once)   timer.h    starts the bpf_timer: adaptive delay,
 *                                                       replica ageing, scoreboard expiry
 *
 *   maps.h     run configuration (cfg), maps          match.h    datagram -> service, request
 *   budget.h   the hedge budget                       replica.h  which replica a hedge goes to
 *   rewrite.h  address rewrites, stored hedges rebuilt
 * The pacer (the delay line) runs its own programs; the hedger is its client
 * (bpf/include/pacer_client.h). The contract with user space is bpf/include/hedge.h. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "split.h"
#include "tick.h"
#include "respond.h"
#include "timer.h"

SEC("tc")
int hedge_split(struct __sk_buff *skb)
{
	return split(skb);
}

SEC("tc")
int hedge_rescue(struct __sk_buff *skb)
{
	return rescue(skb);
}

SEC("tc")
int hedge_resp(struct __sk_buff *skb)
{
	return respond(skb);
}

/* User space runs hedge_arm once through BPF_PROG_TEST_RUN (any 64-byte buffer); it returns
 * 0 on success or the failing helper's error. */
SEC("tc")
int hedge_arm(struct __sk_buff *skb)
{
	return timer_arm();
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
