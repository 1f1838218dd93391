// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* leader.bpf.c - a Raft leader's heartbeats, sent by the kernel while its lease holds
 * (issue 13 item 4; docs/raft.md "Kernel paths: leader heartbeats"). A consumer of the shared
 * pacer (bpf/include/pacer_client.h):
 *   leader_tick   (TC ingress, pacer veth)  pacer_receive; while the lease is fresh and a round
 *                                           is due, one MsgHeartbeat per active follower (its own
 *                                           Commit), cloned out; the next tick at now + interval.
 *                                           Lease expired or absent, or its owner process
 *                                           exiting: nothing, and no next tick.
 * The heartbeat is byte for byte what internal/raft/wire encodes for etcd-raft's MsgHeartbeat
 * without a context (From = leader, To, Term, Commit; everything else zero), in IPv4/UDP from
 * the leader's raft address and port with a full UDP checksum, signed by raft_sign() (auth.h:
 * with a cluster key, RAFT_F_MAC, the kernel channel's next auth_seq and the MAC). It carries
 * nothing through the pacer. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "counters.h"
#include "csum.h"
#include "proto.h"
#include "pacer_client.h"
#include "raft.h"
#include "auth.h"
#include "leader.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct raft_lease);
} leader_lease SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct raft_leader_state);
} leader_state SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct raft_leader_stats);
} leader_counters SEC(".maps");

const enum raft_leader_consts *raft_leader_btf_consts __attribute__((unused));

/* The owner check (Linux 6.2: the task kfuncs, for SCHED_CLS programs too). Weak: on older
 * kernels the loader leaves them unresolved and owner_exiting() says "not exiting". */
extern struct task_struct *bpf_task_from_pid(s32 pid) __ksym __weak;
extern void bpf_task_release(struct task_struct *p) __ksym __weak;

/* libbpf's bpf_ksym_exists (newer bpf_helpers.h than some build hosts ship). */
#define ksym_exists(sym) ({                                                              \
	_Static_assert(!__builtin_constant_p(!!sym), #sym " should be marked as __weak"); \
	!!sym;                                                                           \
})

#define KEDGE_PF_EXITING 0x00000004        /* include/linux/sched.h: set first thing in do_exit */
#define KEDGE_SIGNAL_GROUP_EXIT 0x00000004 /* include/linux/sched/signal.h: set by the kill itself */

/* owner_exiting: the process renewing the lease is dying or gone. A SIGKILLed leader's tcx
 * link (and with it this program) goes only when its files close, late in do_exit and after
 * exit_mm; until then the lease alone would keep its heartbeats going. SIGNAL_GROUP_EXIT is
 * set on the thread group when the fatal signal is delivered (in the killer's context) or at
 * exit_group(); PF_EXITING when its leader thread enters do_exit; a reaped process is not
 * found. 0 with no owner or without the kfuncs (before Linux 6.2): the lease alone decides. */
static __always_inline int owner_exiting(__u32 tgid)
{
	struct task_struct *t;
	int exiting;

	if (!tgid || !ksym_exists(bpf_task_from_pid) || !ksym_exists(bpf_task_release))
		return 0;
	t = bpf_task_from_pid((s32)tgid);
	if (!t)
		return 1;
	exiting = (t->flags & KEDGE_PF_EXITING) || (t->signal->flags & KEDGE_SIGNAL_GROUP_EXIT);
	bpf_task_release(t);
	return exiting;
}

/* The headers of one heartbeat, in the order they go on the wire. */
struct hb_l3 {
	struct iphdr ip;
	struct udphdr udp;
};

/* send_one writes follower f's heartbeat over the skb (already RAFT_HB_FRAME_LEN long) and
 * clones it out of f's device. */
static __always_inline int send_one(struct __sk_buff *skb, struct raft_lease *l, struct raft_follower *f)
{
	struct ethhdr eth = { .h_proto = bpf_htons(ETH_P_IP) };
	struct raft_hdr h = {
		.magic = bpf_htonl(RAFT_MAGIC),
		.version = RAFT_VERSION,
		.type = RAFT_MSG_HEARTBEAT,
	};
	struct hb_l3 l3 = {
		.ip = {
			.version = 4,
			.ihl = 5,
			.tot_len = bpf_htons(sizeof(struct hb_l3) + sizeof(struct raft_hdr)),
			.frag_off = bpf_htons(IP_DF), /* as the node's UDP socket sends */
			.ttl = IPDEFTTL,
			.protocol = IPPROTO_UDP,
		},
		.udp = {
			.len = bpf_htons(sizeof(struct udphdr) + sizeof(struct raft_hdr)),
		},
	};
	__s64 sum;

	__builtin_memcpy(eth.h_dest, f->dmac, ETH_ALEN);
	__builtin_memcpy(eth.h_source, f->smac, ETH_ALEN);
	h.cluster_id = bpf_cpu_to_be64(l->cluster_id);
	h.from = bpf_cpu_to_be64(l->leader);
	h.to = bpf_cpu_to_be64(f->id);
	h.term = bpf_cpu_to_be64(l->term);
	h.commit = bpf_cpu_to_be64(f->commit);
	if (raft_sign(&h, (void *)(&h + 1)) < 0)
		return -1;
	l3.ip.saddr = l->saddr;
	l3.ip.daddr = f->daddr;
	csum_ipv4_set(&l3.ip);
	l3.udp.source = l->sport;
	l3.udp.dest = f->dport;
	/* Full UDP checksum: pseudo header, UDP header (check 0), payload. */
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&l3.udp, sizeof(l3.udp),
			    csum_pseudo4(l->saddr, f->daddr, IPPROTO_UDP, bpf_ntohs(l3.udp.len)));
	if (sum < 0)
		return -1;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&h, sizeof(h), (__u32)sum);
	if (sum < 0)
		return -1;
	l3.udp.check = csum_udp_final(sum);
	if (bpf_skb_store_bytes(skb, 0, &eth, sizeof(eth), 0) < 0 ||
	    bpf_skb_store_bytes(skb, sizeof(eth), &l3, sizeof(l3), 0) < 0 ||
	    bpf_skb_store_bytes(skb, sizeof(eth) + sizeof(l3), &h, sizeof(h), 0) < 0)
		return -1;
	return bpf_clone_redirect(skb, f->ifindex, 0) < 0 ? -1 : 0;
}

static __always_inline struct raft_leader_stats *stats_get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&leader_counters, &zero);
}

/* rearm asks the pacer for the tick of the next round. */
static __always_inline void rearm(struct __sk_buff *skb, struct raft_leader_stats *s, __u64 next)
{
	switch (pacer_request(skb, next)) {
	case PACER_ARMED:
		COUNT(s, rearmed);
		break;
	case PACER_COALESCED:
		COUNT(s, rearm_coalesced);
		break;
	default:
		COUNT(s, rearm_errors);
	}
}

SEC("tc")
int leader_tick(struct __sk_buff *skb)
{
	struct raft_leader_stats *s = stats_get();
	struct raft_leader_state *st;
	struct raft_lease *l;
	struct pacer_tick t;
	__u64 now, expires, next;
	__u32 zero = 0, n;

	switch (pacer_receive(skb, &t)) {
	case PACER_RX_MALFORMED:
		COUNT(s, rx_malformed);
		return TC_ACT_SHOT;
	case PACER_RX_CARRIED:
		COUNT(s, carried);
		return TC_ACT_SHOT;
	}
	COUNT(s, ticks);
	l = bpf_map_lookup_elem(&leader_lease, &zero);
	st = bpf_map_lookup_elem(&leader_state, &zero);
	if (!l || !st)
		return TC_ACT_SHOT;
	now = bpf_ktime_get_ns();
	/* The lease first: user space publishes everything else before it (leader.h). */
	expires = *(volatile __u64 *)&l->expires_ns;
	if (!expires) {
		COUNT(s, ticks_no_lease);
		st->stopped_ns = now;
		return TC_ACT_SHOT;
	}
	if (now >= expires) {
		COUNT(s, ticks_expired);
		st->stopped_ns = now;
		return TC_ACT_SHOT;
	}
	if (owner_exiting(l->owner_tgid)) {
		COUNT(s, ticks_owner_exiting);
		st->stopped_ns = now;
		return TC_ACT_SHOT;
	}
	n = l->nfollowers;
	if (l->interval_ns < RAFT_LEADER_MIN_INTERVAL || n > RAFT_LEADER_FOLLOWERS) {
		COUNT(s, ticks_bad_lease);
		st->stopped_ns = now;
		return TC_ACT_SHOT;
	}
	next = st->next_ns;
	if (next && !pacer_due(next, now, 0) && next - now <= l->interval_ns) {
		/* Early: a stale tick, or one user space armed while a round is pending. */
		COUNT(s, ticks_early);
		rearm(skb, s, next);
		return TC_ACT_SHOT;
	}
	if (bpf_skb_change_tail(skb, RAFT_HB_FRAME_LEN, 0) < 0) {
		COUNT(s, send_errors);
	} else {
		for (__u32 i = 0; i < RAFT_LEADER_FOLLOWERS; i++) {
			if (i >= n)
				break;
			if (!l->f[i].active) {
				COUNT(s, inactive);
				continue;
			}
			if (send_one(skb, l, &l->f[i]) < 0) {
				COUNT(s, send_errors);
				continue;
			}
			COUNT(s, heartbeats);
			st->sent[i]++;
		}
	}
	COUNT(s, ticks_sent);
	st->last_sent_ns = now;
	st->rounds++;
	next = now + l->interval_ns;
	st->next_ns = next;
	rearm(skb, s, next);
	return TC_ACT_SHOT;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
