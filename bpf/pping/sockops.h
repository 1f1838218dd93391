/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* sockops.h - the RTT source "kernel": what the TCP stack measures for this host's sockets.
 *
 * A sock_ops program (pping_sockops) on a cgroup (the cgroup2 root by default, so every
 * process of the host) sees the TCP sockets of that cgroup's processes. When a connection
 * is established in the monitored interface's namespace, it switches the socket's RTT
 * callback on (BPF_SOCK_OPS_RTT_CB_FLAG, 5.3) and gives it a socket-local storage entry
 * (its rate limit); the callback then runs for every ACK that gives the stack an RTT
 * measurement (tcp_rtt_estimator), and pping reports it, rate-limited like the packet
 * sources:
 *   - the measured RTT (args[0], microseconds) where the kernel passes it (6.10+), else the
 *     socket's smoothed RTT (srtt_us), which lags the path by the smoothing;
 *   - the socket's windowed min RTT (rtt_min) and smoothed RTT beside it.
 * It needs no packet program and costs packets nothing: the callback runs in the TCP
 * stack's ACK processing of the tracked sockets only. Sockets established before the
 * monitor started have no callback (the kernel offers none to switch it on for them); the
 * tsval source measures those.
 *
 * Scope: sockets of the namespace whose cookie user space puts into pp_netns_cookie before
 * attaching (bpf_get_netns_cookie for sock_ops, 5.15). Several monitors on one cgroup each
 * have their own storage map, so each sees only the sockets it switched on. */
#ifndef KEDGE_PPING_SOCKOPS_H
#define KEDGE_PPING_SOCKOPS_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "clock.h"
#include "counters.h"
#include "pping.h"
#include "maps.h"
#include "flow.h"

/* The namespace whose sockets the kernel source measures (set by user space at attach). */
volatile __u64 pp_netns_cookie = 0;

/* Per tracked socket: when a sample was last reported (rate limit). */
struct pp_sk_state {
	__u64 last_ts;   /* ns */
	__u64 last_ts_j; /* jiffies */
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct pp_sk_state);
} sk_state SEC(".maps");

/* The socket's endpoints as a reply's flow: source the remote end (whose RTT it is),
 * destination this host, as every RTT event names them. */
static __always_inline int pp_sk_flow(const struct bpf_sock_ops *skops, struct pp_tuple *t)
{
	__builtin_memset(t, 0, sizeof(*t));
	if (skops->family == AF_INET) {
		ipv4_mapped(&t->saddr, skops->remote_ip4);
		ipv4_mapped(&t->daddr, skops->local_ip4);
		t->ipv = 4;
	} else if (skops->family == AF_INET6) {
		/* One load per field: the verifier takes context reads at constant offsets only
		 * (a loop lets clang advance a pointer into the context). */
		t->saddr.in6_u.u6_addr32[0] = skops->remote_ip6[0];
		t->saddr.in6_u.u6_addr32[1] = skops->remote_ip6[1];
		t->saddr.in6_u.u6_addr32[2] = skops->remote_ip6[2];
		t->saddr.in6_u.u6_addr32[3] = skops->remote_ip6[3];
		t->daddr.in6_u.u6_addr32[0] = skops->local_ip6[0];
		t->daddr.in6_u.u6_addr32[1] = skops->local_ip6[1];
		t->daddr.in6_u.u6_addr32[2] = skops->local_ip6[2];
		t->daddr.in6_u.u6_addr32[3] = skops->local_ip6[3];
		t->ipv = 6;
	} else {
		return -1;
	}
	/* remote_port holds the network-order port in its upper half on little-endian hosts
	 * (the kernel loads skc_dport and shifts it), local_port the host-order port. */
	t->sport = (__be16)(skops->remote_port >> 16);
	t->dport = bpf_htons((__u16)skops->local_port);
	t->proto = IPPROTO_TCP;
	t->id_type = PP_ID_KERNEL;
	return 0;
}

static __always_inline void pp_sk_established(struct bpf_sock_ops *skops, struct pp_counters *cnt)
{
	struct bpf_sock *sk = skops->sk;
	struct pp_sk_state *st;

	if (!sk || (skops->family != AF_INET && skops->family != AF_INET6))
		return;
	if (bpf_get_netns_cookie(skops) != pp_netns_cookie) {
		COUNT(cnt, sk_other_netns);
		return;
	}
	st = bpf_sk_storage_get(&sk_state, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st) {
		COUNT(cnt, sk_storage_fail);
		return;
	}
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_RTT_CB_FLAG);
	COUNT(cnt, sk_tracked);
}

static __always_inline void pp_sk_rtt(struct bpf_sock_ops *skops, struct pp_counters *cnt)
{
	__u64 rtt, min_rtt, srtt, gap = pp_cfg.rate_limit_ns, jiff, now;
	struct bpf_sock *sk = skops->sk;
	struct pp_sk_state *st;
	struct pp_tuple flow;

	if (!sk)
		return;
	st = bpf_sk_storage_get(&sk_state, sk, 0, 0);
	if (!st)
		return; /* another monitor's socket, or storage failed when it was established */
	srtt = (__u64)(skops->srtt_us >> 3) * 1000;
	min_rtt = (__u64)skops->rtt_min * 1000;
	/* args[0] is the measurement itself since 6.10 (with the smoothed RTT in args[1]);
	 * before, both are 0 and the smoothed RTT is what there is. */
	rtt = skops->args[1] ? (__u64)skops->args[0] * 1000 : srtt;
	if (!rtt)
		return;
	if (pp_cfg.rtt_rate) {
		__u64 base = pp_cfg.use_srtt ? srtt : min_rtt;

		if (base)
			gap = (pp_cfg.rtt_rate * base) >> PP_FIXPOINT_SHIFT;
	}
	jiff = kedge_jiffies();
	if (st->last_ts && gap) {
		if (pp_cfg.jiffy_ns && jiff >= st->last_ts_j &&
		    (jiff - st->last_ts_j + 1) * pp_cfg.jiffy_ns < gap) {
			COUNT(cnt, ts_rate_limited);
			return;
		}
		now = kedge_now();
		if (now >= st->last_ts && now - st->last_ts < gap) {
			COUNT(cnt, ts_rate_limited);
			return;
		}
	} else {
		now = kedge_now();
	}
	st->last_ts = now;
	st->last_ts_j = jiff;
	if (pp_sk_flow(skops, &flow) < 0)
		return;
	COUNT(cnt, match_rtt);
	if (pp_cfg.aggregate) {
		if (pp_cfg.agg_by_dst)
			pp_agg_rtt(&flow.daddr, flow.ipv, PP_SIDE_LOCAL, rtt, cnt);
		else
			pp_agg_rtt(&flow.saddr, flow.ipv, PP_SIDE_REMOTE, rtt, cnt);
	}
	if (pp_cfg.push_events) {
		struct pp_sample_out o = {
			.rtt = rtt, .min_rtt = min_rtt, .srtt = srtt,
			.sent_pkts = skops->segs_out, .sent_bytes = skops->bytes_acked,
			.rec_pkts = skops->segs_in, .rec_bytes = skops->bytes_received,
		};

		pp_send_rtt(cnt, &flow, now, &o);
	}
}

#endif /* KEDGE_PPING_SOCKOPS_H */
