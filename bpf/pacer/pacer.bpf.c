// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* pacer.bpf.c - kedge's pacer (docs/pacer.md): its own programs, loaded from this object by
 * internal/pacer and attached inside the pacer's namespace. Consumers reach it through
 * bpf/include/pacer_client.h (tick requests and carried packets come in through the veths;
 * the pacer's maps are shared with their objects at load); it never calls them.
 *
 *   consumer netns            pacer netns
 *   <ifname>t (veth) ======= tick peer --+
 *                                         pacer_enter --> dev [qdisc: fq | netem | tbf] == dev_end
 *   <ifname> (veth) ======== peer -------+
 *      ^  TC ingress:                                                                 |
 *      |  the consumer's                                       pacer_pass (TC ingress)|
 *      |  tick program       <------------------ peer (egress) <----- due ----------- +
 *                                                                 not due: round again (dev)
 *
 *   pacer_enter  (TC ingress, both peers)     enter.h: tick request -> tick frame; carried in
 *   pacer_pass   (TC ingress, dev_end)        pass.h: due -> out; not due -> round again;
 *                                             fillers round (conveyor), superseded ticks dropped
 *   frame.h      tick frames and fillers
 * The contract (types) is bpf/include/pacer.h. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "pacer.h"
#include "pacer_client.h"
#include "enter.h"
#include "pass.h"

/* Types referenced here so their BTF reaches bpf2go (-type); nothing reads these. */
const enum pacer_backend *pacer_btf_backend __attribute__((unused));
const enum pacer_consts *pacer_btf_consts __attribute__((unused));
const enum pacer_magic *pacer_btf_magic __attribute__((unused));
const enum pacer_req *pacer_btf_req __attribute__((unused));
const enum pacer_rx *pacer_btf_rx __attribute__((unused));
const struct pacer_tick *pacer_btf_tick __attribute__((unused));
const struct pacer_filler *pacer_btf_filler __attribute__((unused));

SEC("tc")
int pacer_enter(struct __sk_buff *skb)
{
	return enter(skb);
}

SEC("tc")
int pacer_pass(struct __sk_buff *skb)
{
	return after_pass(skb);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
