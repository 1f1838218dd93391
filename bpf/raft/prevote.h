/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* prevote.h - pre-votes answered in XDP (docs/raft.md section 13, "Pre-vote in XDP", has the
 * rules and the safety argument; this is the summary).
 *
 * A pre-vote changes no state on the voter (Raft thesis 9.6; etcd-raft's PreVote): the
 * answer depends only on the voter's term, the last entry of its log and whether it has heard
 * a leader within the election timeout (CheckQuorum). The follower program answers it from
 * mirrors the node writes AFTER they are durable (the term and the last log index/term of
 * the fsynced WAL, the leader of that term) and from the heartbeat map, exactly as etcd-raft's
 * Step does for a MsgPreVote with m.Term > r.Term, and leaves every other case to user space:
 *
 *   no mirrored state, alive_until passed, this node leads,
 *   m.Term == term, a non-empty context (leader transfer)      -> RAFT_PV_PASS
 *   m.Term <  term                                             -> reject, Term = term (stale term)
 *   term < m.Term <= pending term (user space took a term it
 *   has not fsynced yet: it campaigns or voted in it)          -> RAFT_PV_PASS
 *   m.Term >  term, leader known and heard < election timeout  -> RAFT_PV_DROP (etcd-raft ignores it)
 *   m.Term >  term, leader known but never heard               -> RAFT_PV_PASS (cannot tell)
 *
 * "Heard" is the leader's last word: the later of the last heartbeat of the mirrored leader
 * at the mirrored term this program saw (follower_hb) and the last message user space
 * stepped that resets etcd-raft's lease - MsgApp, MsgHeartbeat, MsgSnap, over UDP or TCP -
 * which the node stores into follower_word (memory-mapped: a store, not a system call). The
 * kernel's liveness view is then at least as wide as etcd-raft's: it does not grant a
 * pre-vote its user space would ignore because an append (which XDP does not see) came
 * within the election timeout. The word can only make the program refuse more.
 *   m.Term >  term, candidate's log at least as up to date     -> grant, Term = m.Term
 *   m.Term >  term, candidate's log behind                     -> reject, Term = term (log behind)
 *
 * raft_prevote_decide() is the rule, on a struct raft_pv_view (so fixtures can feed any
 * state); raft_prevote_reply() turns the request into the answer in place (type, from, to,
 * term, the reject flag; every other field zero) - the caller signs it (raft_sign()), swaps
 * the addresses and fixes the checksum. The follower program (bpf/raft/raftxdp.bpf.c,
 * prevote()) fills the view from its maps (maps.h) under their locks.
 */
#ifndef KEDGE_RAFT_PREVOTE_H
#define KEDGE_RAFT_PREVOTE_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "raft.h"

/* What the caller does with the packet. */
#define RAFT_PV_PASS 0 /* XDP_PASS: user space decides */
#define RAFT_PV_TX 1   /* the answer is built in place: sign, turn around, XDP_TX */
#define RAFT_PV_DROP 2 /* XDP_DROP: a leader was heard within the election timeout */

/* Why (for counters and fixtures). */
enum raft_pv_why {
	RAFT_PV_GRANT = 0,
	RAFT_PV_REJECT_TERM = 1,    /* candidate's term below ours */
	RAFT_PV_REJECT_LOG = 2,     /* candidate's log behind our durable log */
	RAFT_PV_IGNORE_LEASE = 3,   /* a leader heard within the election timeout */
	RAFT_PV_PASS_TYPE = 4,      /* not a MsgPreVote */
	RAFT_PV_PASS_NO_STATE = 5,  /* nothing mirrored yet */
	RAFT_PV_PASS_NOT_ALIVE = 6, /* alive_until passed: the node may be dead or stuck */
	RAFT_PV_PASS_LEADER = 7,    /* this node leads */
	RAFT_PV_PASS_SAME_TERM = 8, /* m.Term == term: depends on the vote, user space's */
	RAFT_PV_PASS_CONTEXT = 9,   /* a context (leader transfer forces a vote) */
	RAFT_PV_PASS_UNHEARD = 10,  /* a leader is known but nothing of it was heard (XDP or user space) */
	RAFT_PV_PASS_PENDING = 11,  /* m.Term <= a term user space took and is fsyncing */
	RAFT_PV_WHY_MAX = 12,
};

/* The voter's state as the decision needs it. Times are CLOCK_MONOTONIC ns. */
struct raft_pv_view {
	__u64 self;
	__u64 term;       /* durable current term */
	__u64 last_index; /* last index of the durable log */
	__u64 last_term;  /* its term */
	__u64 leader;     /* leader of term known to the node; 0 = none */
	__u64 heard_ns;   /* last heartbeat from that leader seen in XDP; 0 = never */
	__u64 election_ns;    /* election timeout (the lease of CheckQuorum) */
	__u64 alive_until_ns; /* the node's persist/apply loop refreshes it */
	__u64 now_ns;
	__u32 valid;      /* the node has mirrored its state */
	__u32 _pad;
	__u64 pending_term; /* a term user space has taken, not yet durable (0: none) */
	__u64 word_ns;      /* user space's last word from a leader (follower_word); 0 = none */
};

/* raft_pv_heard is the leader's last word: the later of the two records (0: neither). One
 * definition, used by the lease rule; the node's judges (internal/raft/node lastWordNs) take
 * the same maximum. */
static __always_inline __u64 raft_pv_heard(const struct raft_pv_view *v)
{
	return v->word_ns > v->heard_ns ? v->word_ns : v->heard_ns;
}

static __always_inline int raft_prevote_decide(const struct raft_hdr *h, const struct raft_pv_view *v,
					       __u32 *why)
{
	__u64 mterm, lterm, lindex, heard;

	if (h->type != RAFT_MSG_PRE_VOTE) {
		*why = RAFT_PV_PASS_TYPE;
		return RAFT_PV_PASS;
	}
	if (!v->valid) {
		*why = RAFT_PV_PASS_NO_STATE;
		return RAFT_PV_PASS;
	}
	if (v->now_ns >= v->alive_until_ns) {
		*why = RAFT_PV_PASS_NOT_ALIVE;
		return RAFT_PV_PASS;
	}
	if (v->leader == v->self) {
		*why = RAFT_PV_PASS_LEADER;
		return RAFT_PV_PASS;
	}
	mterm = bpf_be64_to_cpu(h->term);
	if (mterm < v->term) {
		*why = RAFT_PV_REJECT_TERM;
		return RAFT_PV_TX;
	}
	if (mterm == v->term) {
		*why = RAFT_PV_PASS_SAME_TERM;
		return RAFT_PV_PASS;
	}
	if (mterm <= v->pending_term) {
		/* The node is ahead of its durable mirror: it campaigns in that term (its own
		 * vote being fsynced) or voted in it. etcd-raft refuses such a pre-vote unless
		 * the vote was for this candidate; granting from the durable term would let two
		 * candidates of one term both reach a pre-vote quorum and split the real vote. */
		*why = RAFT_PV_PASS_PENDING;
		return RAFT_PV_PASS;
	}
	if (h->ctx_len) {
		*why = RAFT_PV_PASS_CONTEXT;
		return RAFT_PV_PASS;
	}
	if (v->leader) {
		heard = raft_pv_heard(v);
		if (!heard) {
			*why = RAFT_PV_PASS_UNHEARD;
			return RAFT_PV_PASS;
		}
		/* A word stored after now (user space read its clock after this program did) is
		 * recent: the unsigned difference would wrap, so compare the other way round. */
		if (heard >= v->now_ns || v->now_ns - heard < v->election_ns) {
			*why = RAFT_PV_IGNORE_LEASE;
			return RAFT_PV_DROP;
		}
	}
	lterm = bpf_be64_to_cpu(h->log_term);
	lindex = bpf_be64_to_cpu(h->index);
	if (lterm > v->last_term || (lterm == v->last_term && lindex >= v->last_index))
		*why = RAFT_PV_GRANT;
	else
		*why = RAFT_PV_REJECT_LOG;
	return RAFT_PV_TX;
}

/* raft_prevote_reply rewrites the request h into the answer of raft_prevote_decide()'s why:
 * MsgPreVoteResp from self to the candidate; a grant carries the candidate's term, a reject
 * the voter's (etcd-raft's Step). The authentication fields are cleared for raft_sign(). */
static __always_inline void raft_prevote_reply(struct raft_hdr *h, const struct raft_pv_view *v, __u32 why)
{
	__be64 cand = h->from;
	__u8 reject = why != RAFT_PV_GRANT;

	h->type = RAFT_MSG_PRE_VOTE_RESP;
	h->flags = reject ? RAFT_F_REJECT : 0;
	h->ctx_len = 0;
	h->from = bpf_cpu_to_be64(v->self);
	h->to = cand;
	if (reject)
		h->term = bpf_cpu_to_be64(v->term);
	h->log_term = 0;
	h->index = 0;
	h->commit = 0;
	h->reject_hint = 0;
	__builtin_memset(h->ctx, 0, RAFT_CTX_MAX);
	h->auth_seq = 0;
	__builtin_memset(h->mac, 0, RAFT_MAC_LEN);
}

#endif /* KEDGE_RAFT_PREVOTE_H */
