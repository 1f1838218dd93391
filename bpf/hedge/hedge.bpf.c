// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* hedge.bpf.c - the client side of kedge's transparent UDP request hedger: its entry
 * points, each one call into the file that holds its concern.
 *   hedge_split  (TC egress, client iface)       record the request; store it for a tick
 *                                                (stored path) or clone it into the delay line
 *   hedge_rescue (TC ingress, pacer veth)        the pacer's tick program: a tick sends every
 *                                                due stored request's hedge; a clone is
 *                                                dropped, sent round again, or sent as the hedge
 *   hedge_resp   (TC ingress, client iface)      first response wins; drop the duplicate
 *   hedge_arm    (BPF_PROG_TEST_RUN, once)       starts the bpf_timer: adaptive delay + expiry
 * The pacer (the delay line) runs its own programs; the hedger is its client
 * (bpf/include/pacer_client.h): clones ride it as carried packets, each with its deadline.
 *
 *   maps.h       run configuration (cfg), maps, counters
 *   request.h    match, rewrites, and the split / rescue / respond handlers
 *   store.h      the stored path: per-service store rings, the tick's hedges
 *   budget.h     the hedge budget: a sliding window (default) or a token bucket
 *   timer.h      latency and precision histograms, adaptive delay, scoreboard expiry
 * The contract with user space is bpf/include/hedge.h. */
#include "maps.h"
#include "timer.h"
#include "request.h"

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
