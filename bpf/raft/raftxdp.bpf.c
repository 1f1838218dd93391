// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* raftxdp: the follower's XDP program (docs/raft.md "Kernel paths: follower").
 *
 *   raftx_xdp   (XDP on the interface of the node's raft address)
 *
 * Every UDP packet to the raft port is checked (raft_hdr_check, then raft_auth_src) and
 * dropped with a reason counter when it fails. Then:
 *  - MsgHeartbeat from the mirrored leader, at exactly the mirrored (durable) term, from the
 *    leader's address, while alive_until_ns is in the future: rewritten in place into the
 *    MsgHeartbeatResp etcd-raft would send (From/To swapped, the follower's term, the same
 *    Context), signed, reflected (MAC/IP/ports swapped, full UDP checksum) and sent with
 *    XDP_TX. Leader, term, commit and arrival time go to follower_hb, and the failure
 *    detector's bpf_timer is re-armed for detect_after_ns (or detect_ns) + jitter.
 *  - MsgPreVote: prevote() (the rule in prevote.h) answers it (signed and reflected like a heartbeat
 *    reply), drops it while the leader's lease holds (etcd-raft ignores it), or passes it.
 *  - while this node leads: a follower's MsgHeartbeatResp is recorded (leader_acks) and
 *    passed; a voter's MsgAppResp goes through the quorum wait (app_ack, leader_quorum): one
 *    that moves neither its sender's match nor the commit index is recorded and absorbed,
 *    the node steps the record at its next tick.
 *  - everything else: XDP_PASS to user space, counted.
 * With a cluster key and a pass mark (raftx_cfg.mark, 16 random bytes user space draws at load),
 * every raft packet passed up after its MAC was verified here carries the mark in place of
 * the MAC (UDP checksum updated incrementally): the node's transport then skips its own
 * SipHash of the packet (wire.Verifier.SetPassMark). A packet that arrives with the mark in
 * its MAC field fails the MAC check like any other forgery; the mark never leaves the host.
 * When the timer expires (no answered heartbeat for the election timeout) it writes a
 * RAFTX_EV_LEADER_SILENT record to the follower_events ring buffer; the node wakes and starts
 * a pre-vote. Nothing here is durable: a term change, a vote or an append is never answered
 * in the kernel. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "counters.h"
#include "csum.h"
#include "parse.h"
#include "proto.h"
#include "raft.h"
#include "maps.h"
/* Authentication (cluster id, allowlist, MAC, replay window) and signing: auth.h.
 * The pre-vote rule answered from the durable mirror and the heartbeat record: prevote.h. */
#include "auth.h"
#include "prevote.h"

/* The node's identity, port and pass mark; set by Go before loading (maps.h). */
const volatile struct raftx_config raftx_cfg = {};

/* Keep the ring buffer record's type in BTF for bpf2go (it is only reserved by size). */
const struct raftx_event *unused_raftx_event __attribute__((unused));

/* The UDP header and the raft header, bounds-checked as one. */
struct raftx_udp {
	struct udphdr udp;
	struct raft_hdr h;
};

/* reflect turns the received frame around: Ethernet addresses, IP addresses and UDP ports
 * swapped, TTL/hop limit reset, and the UDP checksum computed over the final bytes (the
 * received one may be CHECKSUM_PARTIAL's pseudo-header sum: never patched incrementally).
 * Returns 0, or -1 when a header is not where parse_pkt() said (not reached in practice). */
static __noinline int reflect(void *data, void *data_end, struct pkt *p, struct raftx_udp *u)
{
	struct ethhdr *eth = data;
	__u8 mac[ETH_ALEN];
	__be16 port;
	__s64 sum;

	if ((void *)(eth + 1) > data_end)
		return -1;
	__builtin_memcpy(mac, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, mac, ETH_ALEN);

	port = u->udp.source;
	u->udp.source = u->udp.dest;
	u->udp.dest = port;
	u->udp.check = 0;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)u, sizeof(*u), 0); /* UDP and raft headers */
	if (sum < 0)
		return -1;

	if (p->l3_proto == ETH_P_IP) {
		struct iphdr *ip = pkt_hdr(data, data_end, p->l3_off, sizeof(*ip));
		__be32 a;
		__be16 old;

		if (!ip)
			return -1;
		a = ip->saddr;
		ip->saddr = ip->daddr;
		ip->daddr = a;
		old = *(__be16 *)&ip->ttl; /* ttl and protocol share one checksummed word */
		ip->ttl = IPDEFTTL;
		ip->check = csum_replace2(ip->check, old, *(__be16 *)&ip->ttl);
		u->udp.check = csum_udp_final((__u64)sum + csum_pseudo4(ip->saddr, ip->daddr, IPPROTO_UDP,
									 bpf_ntohs(u->udp.len)));
	} else {
		struct ipv6hdr *ip6 = pkt_hdr(data, data_end, p->l3_off, sizeof(*ip6));
		struct in6_addr a;

		if (!ip6)
			return -1;
		a = ip6->saddr;
		ip6->saddr = ip6->daddr;
		ip6->daddr = a;
		ip6->hop_limit = IPDEFTTL;
		u->udp.check = csum_udp_final((__u64)sum + csum_pseudo6(&ip6->saddr, &ip6->daddr, IPPROTO_UDP,
									 bpf_ntohs(u->udp.len)));
	}
	return 0;
}

/* check runs raft_hdr_check and raft_auth_src. Not inlined: SipHash's state lives in its own
 * frame, not in the main program's (the stack of a call chain is bounded by 512 bytes). */
static __noinline int check(struct raftx_udp *u, void *data_end, __u32 payload_len, struct in6_addr *saddr,
			    __be16 sport)
{
	int reason;

	if ((void *)(u + 1) > data_end)
		return RAFT_DROP_SHORT;
	reason = raft_hdr_check(&u->h, data_end, payload_len, raftx_cfg.cluster_id, raftx_cfg.self);
	if (!reason)
		reason = raft_auth_src(&u->h, data_end, saddr, sport);
	return reason;
}

/* sign is raft_sign (a MAC on the kernel channel when the cluster has a key). Not inlined,
 * like check, and called from the main program, not from answer: the chain stays short. */
static __noinline int sign(struct raftx_udp *u, void *data_end)
{
	if ((void *)(u + 1) > data_end)
		return -1;
	return raft_sign(&u->h, data_end);
}

/* answer signs the header built in place and turns the frame around. */
static __always_inline int answer(void *data, void *data_end, struct pkt *p, struct raftx_udp *u,
				  struct raftx_stats *s)
{
	if (sign(u, data_end) < 0) {
		COUNT(s, sign_failed);
		return -1;
	}
	if (reflect(data, data_end, p, u) < 0) {
		COUNT(s, reflect_failed);
		return -1;
	}
	return 0;
}

/* prevote decides a MsgPreVote by raft_prevote_decide() (prevote.h) on a view filled from the
 * maps: follower_state (the durable mirror) and follower_hb (heartbeats seen in XDP) under
 * their locks, follower_word (user space's last word, one 64-bit load). On RAFT_PV_TX it has
 * rewritten the header into the answer (unsigned). In a frame of its own (the view). */
static __noinline int prevote(struct xdp_md *ctx, struct raftx_udp *u, void *data_end)
{
	struct raft_pv_view v = {};
	struct raftx_state *st;
	struct raftx_word *w;
	struct raftx_hb *hb;
	__u32 zero = 0, why;
	int ret;

	if ((void *)(u + 1) > data_end)
		return RAFT_PV_PASS;
	st = bpf_map_lookup_elem(&follower_state, &zero);
	hb = bpf_map_lookup_elem(&follower_hb, &zero);
	w = bpf_map_lookup_elem(&follower_word, &zero);
	if (!st || !hb || !w)
		return RAFT_PV_PASS;
	v.self = raftx_cfg.self;
	bpf_spin_lock(&st->lock);
	v.term = st->term;
	v.last_index = st->last_index;
	v.last_term = st->last_term;
	v.leader = st->leader;
	v.election_ns = st->detect_ns;
	v.alive_until_ns = st->alive_until_ns;
	v.pending_term = st->pending_term;
	bpf_spin_unlock(&st->lock);
	v.valid = v.term != 0;
	bpf_spin_lock(&hb->lock);
	if (hb->leader == v.leader && hb->term == v.term)
		v.heard_ns = hb->last_ns;
	bpf_spin_unlock(&hb->lock);
	v.word_ns = *(volatile __u64 *)&w->last_ns;
	v.now_ns = bpf_ktime_get_ns();
	ret = raft_prevote_decide(&u->h, &v, &why);
	if (ret == RAFT_PV_TX)
		raft_prevote_reply(&u->h, &v, why);
	return ret;
}

static int detect_fired(void *map, __u32 *key, struct raftx_detect *d)
{
	struct raftx_stats *s;
	struct raftx_event *e;
	__u32 zero = 0;

	s = bpf_map_lookup_elem(&follower_stats, &zero);
	e = bpf_ringbuf_reserve(&follower_events, sizeof(*e), 0);
	if (!e) {
		COUNT(s, detect_ringbuf_full);
		return 0;
	}
	e->type = RAFTX_EV_LEADER_SILENT;
	e->_pad = 0;
	e->leader = d->leader;
	e->term = d->term;
	e->last_ns = d->last_ns;
	e->now_ns = bpf_ktime_get_ns();
	/* A heartbeat on another CPU may have re-armed the timer while this expiry was being
	 * delivered (arm() writes expires_ns after the fields read above): then the silence is
	 * over, and the new arming fires later if a new one lasts. */
	if (e->now_ns < d->expires_ns) {
		bpf_ringbuf_discard(e, 0);
		COUNT(s, detect_rearmed);
		return 0;
	}
	bpf_ringbuf_submit(e, 0);
	COUNT(s, detect_fired);
	return 0;
}

/* arm (re)starts the failure detector after a heartbeat from leader at term. */
static __always_inline void arm(struct raftx_stats *s, __u64 leader, __u64 term, __u64 now,
				__u64 detect_ns, __u64 jitter_ns)
{
	struct raftx_detect *d;
	__u32 zero = 0;
	__u64 t;
	long err;

	if (!detect_ns)
		return;
	d = bpf_map_lookup_elem(&follower_timer, &zero);
	if (!d)
		return;
	if (!d->inited) {
		err = bpf_timer_init(&d->timer, &follower_timer, CLOCK_MONOTONIC);
		if (err && err != -EBUSY) {
			COUNT(s, detect_init_failed);
			return;
		}
		if (bpf_timer_set_callback(&d->timer, detect_fired)) {
			COUNT(s, detect_init_failed);
			return;
		}
		d->inited = 1;
	}
	d->leader = leader;
	d->term = term;
	d->last_ns = now;
	t = detect_ns;
	if (jitter_ns)
		t += bpf_get_prandom_u32() % jitter_ns;
	d->expires_ns = now + t;
	if (bpf_timer_start(&d->timer, t, 0) == 0)
		COUNT(s, detect_armed);
}

static __always_inline int heartbeat(void *data, void *data_end, struct pkt *p, struct raftx_udp *u,
				     struct raftx_stats *s)
{
	struct raft_hdr *h = &u->h;
	__u64 term = bpf_be64_to_cpu(h->term), from = bpf_be64_to_cpu(h->from);
	__u64 commit = bpf_be64_to_cpu(h->commit);
	__u64 now = bpf_ktime_get_ns();
	__u64 cur_term, cur_leader, alive_until, detect_ns, jitter_ns, detect_after;
	struct in6_addr leader_addr;
	struct raftx_state *st;
	struct raftx_hb *hb;
	__be16 leader_port;
	__u32 zero = 0;

	st = bpf_map_lookup_elem(&follower_state, &zero);
	hb = bpf_map_lookup_elem(&follower_hb, &zero);
	if (!st || !hb)
		return XDP_PASS;
	bpf_spin_lock(&st->lock);
	cur_term = st->term;
	cur_leader = st->leader;
	leader_addr = st->leader_addr;
	leader_port = st->leader_port;
	alive_until = st->alive_until_ns;
	detect_ns = st->detect_ns;
	jitter_ns = st->detect_jitter_ns;
	detect_after = st->detect_after_ns;
	bpf_spin_unlock(&st->lock);

	if (!cur_term) {
		COUNT(s, hb_no_state);
		return XDP_PASS;
	}
	if (term < cur_term) {
		COUNT(s, hb_stale_term);
		return XDP_PASS;
	}
	if (term > cur_term) {
		COUNT(s, hb_new_term);
		return XDP_PASS;
	}
	if (!cur_leader || from != cur_leader) {
		COUNT(s, hb_leader);
		return XDP_PASS;
	}
	if (!in6_addr_eq(&p->saddr, &leader_addr) || p->sport != leader_port) {
		COUNT(s, hb_leader_addr);
		return XDP_PASS;
	}
	/* detect_ns == 0 turns the detector off; detect_after_ns moves its deadline (the node's
	 * rank after this leader: followers fire one after the other, not at once). */
	if (detect_ns && detect_after)
		detect_ns = detect_after;
	if (now >= alive_until) {
		/* Not answered: the node's persist/apply loop has not refreshed its deadline (it
		 * may be dead, hung or stuck on its disk), and the packet goes up to its socket.
		 * But the leader is not silent: its arrival is recorded (not counted as answered)
		 * and the detector re-armed. Without that, a node whose loop was starved past the
		 * bound woke to a record that said "silent" while the heartbeats sat unread in its
		 * socket: its detector's event and its lease judged in real time (the node's
		 * judgeLease) started or granted an election against a live leader (docs/raft.md
		 * section 14, "A starved follower's record"). */
		bpf_spin_lock(&hb->lock);
		if (hb->term != term || hb->leader != from) {
			hb->term = term;
			hb->leader = from;
			hb->commit = 0;
		}
		hb->last_ns = now;
		bpf_spin_unlock(&hb->lock);
		arm(s, from, term, now, detect_ns, jitter_ns);
		COUNT(s, hb_not_alive);
		return XDP_PASS;
	}

	/* etcd-raft's follower: commitTo(m.Commit), then
	 * send(MsgHeartbeatResp{To: m.From, Context: m.Context}) with Term = r.Term. */
	h->type = RAFT_MSG_HEARTBEAT_RESP;
	h->flags = 0;
	h->to = h->from;
	h->from = bpf_cpu_to_be64(raftx_cfg.self);
	h->log_term = 0;
	h->index = 0;
	h->commit = 0;
	h->reject_hint = 0;
	h->auth_seq = 0;
	__builtin_memset(h->mac, 0, RAFT_MAC_LEN);
	if (answer(data, data_end, p, u, s) < 0)
		return XDP_ABORTED; /* the header is half rewritten: it cannot go up either */

	bpf_spin_lock(&hb->lock);
	if (hb->term != term || hb->leader != from) {
		hb->term = term;
		hb->leader = from;
		hb->commit = 0;
	}
	if (commit > hb->commit)
		hb->commit = commit;
	hb->last_ns = now;
	hb->answered_ns = now;
	hb->count++;
	bpf_spin_unlock(&hb->lock);
	arm(s, from, term, now, detect_ns, jitter_ns);
	COUNT(s, hb_answered);
	return XDP_TX;
}

/* leads reports whether the mirrored state says this node leads term. */
static __always_inline int leads(__u64 term)
{
	struct raftx_state *st;
	__u64 cur_term, cur_leader;
	__u32 zero = 0;

	st = bpf_map_lookup_elem(&follower_state, &zero);
	if (!st)
		return 0;
	bpf_spin_lock(&st->lock);
	cur_term = st->term;
	cur_leader = st->leader;
	bpf_spin_unlock(&st->lock);
	return cur_term && cur_leader == raftx_cfg.self && term == cur_term;
}

/* ack records a follower's MsgHeartbeatResp while this node leads at its term (maps.h
 * leader_acks); returns 1 when recorded. The packet goes up either way. */
static __always_inline int ack(struct raft_hdr *h, struct raftx_stats *s)
{
	__u64 term = bpf_be64_to_cpu(h->term), from = bpf_be64_to_cpu(h->from);
	struct raftx_ack *a, n = {};

	if (!leads(term))
		return 0;
	a = bpf_map_lookup_elem(&leader_acks, &from);
	if (!a) {
		n.term = term;
		n.last_ns = bpf_ktime_get_ns();
		n.count = 1;
		if (bpf_map_update_elem(&leader_acks, &from, &n, BPF_NOEXIST) && !bpf_map_lookup_elem(&leader_acks, &from)) {
			COUNT(s, ack_full);
			return 0;
		}
		COUNT(s, ack_recorded);
		return 1;
	}
	a->term = term;
	a->last_ns = bpf_ktime_get_ns();
	__sync_fetch_and_add(&a->count, 1);
	COUNT(s, ack_recorded);
	return 1;
}

enum { APP_PASS, APP_RECORDED, APP_ABSORBED };

/* app_ack is the quorum wait (maps.h leader_quorum) for a MsgAppResp: a voter's acceptance
 * at the term this node leads is recorded, and absorbed when it moves neither the voter's
 * highest acknowledged index (a duplicate: the answer to a commit-only append) nor the commit
 * index (k other voters acknowledged that index already). A rejection, another term, a
 * learner or a node that does not lead passes untouched. */
static __always_inline int app_ack(struct raft_hdr *h)
{
	__u64 term = bpf_be64_to_cpu(h->term), from = bpf_be64_to_cpu(h->from);
	__u64 index = bpf_be64_to_cpu(h->index);
	__u32 zero = 0, i, n, k, slot = RAFTX_QUORUM_MAX, others = 0;
	struct raftx_quorum *q;
	int ret = APP_RECORDED;

	if ((h->flags & RAFT_F_REJECT) || !leads(term))
		return APP_PASS;
	q = bpf_map_lookup_elem(&leader_quorum, &zero);
	if (!q)
		return APP_PASS;
	bpf_spin_lock(&q->lock);
	n = q->n;
	if (q->term != term) {
		q->term = term;
#pragma unroll
		for (i = 0; i < RAFTX_QUORUM_MAX; i++) {
			q->v[i].index = 0;
			q->v[i].count = 0;
			q->v[i].absorbed = 0;
		}
	}
#pragma unroll
	for (i = 0; i < RAFTX_QUORUM_MAX; i++) {
		if (i < n && q->v[i].id == from)
			slot = i;
		else if (i < n && q->v[i].index >= index)
			others++;
	}
	if (slot >= RAFTX_QUORUM_MAX) {
		bpf_spin_unlock(&q->lock);
		return APP_PASS;
	}
	/* With the leader's own acknowledgement (etcd-raft's leader acknowledges its entries
	 * once they are durable, before it sends them), k of the other n voters make a quorum. */
	k = (n + 1) / 2;
	if (index <= q->v[slot].index || others >= k) {
		q->v[slot].absorbed++;
		ret = APP_ABSORBED;
	}
	if (index > q->v[slot].index)
		q->v[slot].index = index;
	q->v[slot].count++;
	bpf_spin_unlock(&q->lock);
	return ret;
}

/* mark writes the pass mark over the MAC of a keyed raft packet that passed check() and goes
 * up to user space; the UDP checksum follows (RFC 1624: HC' = ~(~HC + ~m + m')), so a stack
 * that verifies it - a NIC without checksum offload - still accepts the packet; an IPv4
 * "no checksum" 0 stays 0. Patched, not recomputed as reflect() does: a packet a local
 * sender handed a veth (CHECKSUM_PARTIAL) holds a pseudo-header sum, which the receiving
 * stack does not check, and the packet goes no further than the socket. Not inlined: the
 * main program's frame stays small. */
static __noinline void mark(struct raftx_udp *u, void *data_end, struct raftx_stats *s)
{
	__u64 old[2], mark[2] = {raftx_cfg.mark[0], raftx_cfg.mark[1]};
	__s64 diff;

	if ((void *)(u + 1) > data_end || !(u->h.flags & RAFT_F_MAC))
		return;
	__builtin_memcpy(old, u->h.mac, RAFT_MAC_LEN);
	__builtin_memcpy(u->h.mac, mark, RAFT_MAC_LEN);
	if (u->udp.check) {
		diff = bpf_csum_diff((__be32 *)old, RAFT_MAC_LEN, (__be32 *)mark, RAFT_MAC_LEN, 0);
		u->udp.check = udp_csum_mangled(csum_replace_diff(u->udp.check, (__u32)diff));
	}
	COUNT(s, marked);
}

/* dispatch acts on a raft packet check() accepted. */
static __always_inline int dispatch(struct xdp_md *ctx, void *data, void *data_end, struct pkt *p,
				    struct raftx_udp *u, struct raftx_stats *s)
{
	int reason;

	switch (u->h.type) {
	case RAFT_MSG_HEARTBEAT:
		return heartbeat(data, data_end, p, u, s);
	case RAFT_MSG_HEARTBEAT_RESP:
		if (ack(&u->h, s))
			return XDP_PASS;
		break;
	case RAFT_MSG_APP_RESP:
		switch (app_ack(&u->h)) {
		case APP_ABSORBED:
			COUNT(s, app_absorbed);
			return XDP_DROP;
		case APP_RECORDED:
			COUNT(s, app_recorded);
			return XDP_PASS;
		}
		break;
	case RAFT_MSG_PRE_VOTE:
		reason = prevote(ctx, u, data_end);
		if (reason == RAFT_PV_DROP) {
			COUNT(s, pv_dropped);
			return XDP_DROP;
		}
		if (reason != RAFT_PV_TX) {
			COUNT(s, pv_passed);
			return XDP_PASS;
		}
		if (answer(data, data_end, p, u, s) < 0)
			return XDP_ABORTED;
		COUNT(s, pv_answered);
		return XDP_TX;
	}
	COUNT(s, passed_type);
	return XDP_PASS;
}

SEC("xdp")
int raftx_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct raftx_stats *s;
	struct raftx_udp *u;
	struct pkt p = {};
	__u32 zero = 0;
	int reason, act;

	s = bpf_map_lookup_elem(&follower_stats, &zero);
	if (!s)
		return XDP_PASS;
	if (parse_pkt(data, data_end, &p) != PARSE_OK || p.l4_proto != IPPROTO_UDP ||
	    p.dport != bpf_htons(raftx_cfg.port)) {
		COUNT(s, not_raft);
		return XDP_PASS;
	}
	COUNT(s, rx);
	u = pkt_hdr(data, data_end, p.l4_off, sizeof(*u));
	reason = u ? check(u, data_end, p.payload_len, &p.saddr, p.sport) : RAFT_DROP_SHORT;
	if (reason) {
		COUNT(s, drop[reason & (RAFTX_DROP_SLOTS - 1)]);
		return XDP_DROP;
	}
	act = dispatch(ctx, data, data_end, &p, u, s);
	if (act == XDP_PASS && (raftx_cfg.mark[0] | raftx_cfg.mark[1])) {
		/* dispatch's helpers may have moved nothing, but the verifier forgets packet
		 * pointers across calls: find the header again. */
		data = (void *)(long)ctx->data;
		data_end = (void *)(long)ctx->data_end;
		u = pkt_hdr(data, data_end, p.l4_off, sizeof(*u));
		if (u)
			mark(u, data_end, s);
	}
	return act;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
