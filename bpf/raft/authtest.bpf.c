// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* authtest: exposes siphash.h, auth.h and prevote.h to BPF_PROG_TEST_RUN for
 * internal/raft/wire's tests.
 * Not attached anywhere.
 * *  - siphash_xdp: SipHash-2-4 (64 or 128 bit) of a message of 0-63 bytes held in the 'vec'
 *    map, for the reference test vectors;
 *  - auth_xdp: what the follower program does with a Raft packet before anything else -
 *    parse_pkt(), raft_hdr_check(), raft_auth() - and XDP_DROP on a refusal, with the verdict
 *    in 'verdict' and a per-CPU count per reason;
 *  - sign_xdp: raft_sign() on the Raft header of the packet, XDP_TX; the Go side verifies
 *    the result with its own Verifier;
 *  - prevote_xdp: a Raft packet through the checks of auth_xdp, then raft_prevote_decide() on
 *    the view in 'pv_view' and, when it answers, raft_prevote_reply() + raft_sign(): XDP_TX,
 *    XDP_DROP or XDP_PASS as the follower program returns them; the reason in 'pv_why'.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "parse.h"
#include "raft.h"
#include "siphash.h"
#include "auth.h"
#include "prevote.h"

/* The receiver's identity; set by the test before loading. */
struct authtest_config {
	__u64 self;
};

const volatile struct authtest_config authtest_cfg = {};

#define VEC_MSG_MAX 64

struct siphash_vec {
	__u64 k0, k1;
	__u32 len; /* < VEC_MSG_MAX */
	__u32 out128;
	__u8 msg[VEC_MSG_MAX];
	__u64 out[2];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct siphash_vec);
} vec SEC(".maps");

struct authtest_verdict {
	__s32 parse_ret;
	__u32 hdr_check; /* enum raft_drop from raft_hdr_check() */
	__u32 auth;      /* enum raft_drop from raft_auth() */
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct authtest_verdict);
} verdict SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, RAFT_DROP_MAX);
	__type(key, __u32);
	__type(value, __u64);
} drops SEC(".maps");

SEC("xdp")
int siphash_xdp(struct xdp_md *ctx)
{
	struct siphash_vec *v;
	struct siphash_state s;
	__u64 m, tail = 0;
	__u32 zero = 0, len, base;

	v = bpf_map_lookup_elem(&vec, &zero);
	if (!v)
		return XDP_ABORTED;
	len = v->len & (VEC_MSG_MAX - 1);
	siphash_init(&s, v->k0, v->k1, v->out128);
	for (int i = 0; i < VEC_MSG_MAX / 8; i++) {
		if (8 * i + 8 > len)
			break;
		__builtin_memcpy(&m, &v->msg[8 * i], 8);
		siphash_word(&s, m);
	}
	base = len & ~7U;
	for (int j = 0; j < 7; j++) {
		if (base + j >= len)
			break;
		tail |= (__u64)v->msg[(base + j) & (VEC_MSG_MAX - 1)] << (8 * j);
	}
	siphash_final(&s, siphash_tail_word(tail, len), v->out128, v->out);
	return XDP_PASS;
}

static __always_inline struct raft_hdr *raft_pkt(struct xdp_md *ctx, struct pkt *p, int *ret)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;

	*ret = parse_pkt(data, data_end, p);
	if (*ret != PARSE_OK || p->l4_proto != IPPROTO_UDP)
		return NULL;
	return pkt_hdr(data, data_end, p->payload_off, sizeof(struct raft_hdr));
}

SEC("xdp")
int auth_xdp(struct xdp_md *ctx)
{
	void *data_end = (void *)(long)ctx->data_end;
	struct authtest_verdict *r;
	struct raft_auth_config *cfg;
	struct raft_hdr *h;
	struct pkt p = {};
	__u32 zero = 0, reason;
	__u64 *cnt;

	r = bpf_map_lookup_elem(&verdict, &zero);
	cfg = bpf_map_lookup_elem(&raft_auth_cfg, &zero);
	if (!r || !cfg)
		return XDP_ABORTED;
	__builtin_memset(r, 0, sizeof(*r));
	h = raft_pkt(ctx, &p, &r->parse_ret);
	if (!h) {
		reason = RAFT_DROP_SHORT;
		r->hdr_check = reason;
		goto drop;
	}
	reason = raft_hdr_check(h, data_end, p.payload_len, cfg->cluster_id, authtest_cfg.self);
	r->hdr_check = reason;
	if (reason != RAFT_OK)
		goto drop;
	reason = raft_auth(ctx, h, data_end);
	r->auth = reason;
	if (reason == RAFT_OK)
		return XDP_PASS;
drop:
	cnt = bpf_map_lookup_elem(&drops, &reason);
	if (cnt)
		*cnt += 1;
	return XDP_DROP;
}

SEC("xdp")
int sign_xdp(struct xdp_md *ctx)
{
	void *data_end = (void *)(long)ctx->data_end;
	struct raft_hdr *h;
	struct pkt p = {};
	int ret;

	h = raft_pkt(ctx, &p, &ret);
	if (!h || raft_sign(h, data_end))
		return XDP_ABORTED;
	return XDP_TX;
}

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct raft_pv_view);
} pv_view SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, enum raft_pv_why);
} pv_why SEC(".maps");

SEC("xdp")
int prevote_xdp(struct xdp_md *ctx)
{
	void *data_end = (void *)(long)ctx->data_end;
	struct authtest_verdict *r;
	struct raft_auth_config *cfg;
	struct raft_pv_view *v;
	struct raft_hdr *h;
	struct pkt p = {};
	__u32 zero = 0, *why;
	int ret;

	/* enum raft_pv_why and __u32 are the same 4 bytes */

	r = bpf_map_lookup_elem(&verdict, &zero);
	cfg = bpf_map_lookup_elem(&raft_auth_cfg, &zero);
	v = bpf_map_lookup_elem(&pv_view, &zero);
	why = bpf_map_lookup_elem(&pv_why, &zero);
	if (!r || !cfg || !v || !why)
		return XDP_ABORTED;
	__builtin_memset(r, 0, sizeof(*r));
	*why = RAFT_PV_WHY_MAX;
	h = raft_pkt(ctx, &p, &r->parse_ret);
	if (!h)
		return XDP_DROP;
	r->hdr_check = raft_hdr_check(h, data_end, p.payload_len, cfg->cluster_id, authtest_cfg.self);
	if (r->hdr_check)
		return XDP_DROP;
	r->auth = raft_auth_src(h, data_end, &p.saddr, p.sport);
	if (r->auth)
		return XDP_DROP;
	ret = raft_prevote_decide(h, v, why);
	if (ret == RAFT_PV_DROP)
		return XDP_DROP;
	if (ret != RAFT_PV_TX)
		return XDP_PASS;
	raft_prevote_reply(h, v, *why);
	if (raft_sign(h, data_end))
		return XDP_ABORTED;
	return XDP_TX;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
