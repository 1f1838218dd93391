// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* raftwire: exposes raft.h's raft_hdr_check() to BPF_PROG_TEST_RUN, as an XDP program that
 * parses Ethernet/IP/UDP with parse.h and then the raft header at a constant offset after
 * the UDP header - what part 2's responders will do. It stores the verdict and the header's
 * host-order fields in the one-slot 'result' map; internal/raft/wire's tests compare them
 * with the Go codec's. Not attached anywhere. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "parse.h"
#include "raft.h"

/* The receiver's identity; set by the test before loading. */
struct raftwire_config {
	__u64 cluster_id;
	__u64 self;
};

const volatile struct raftwire_config raftwire_cfg = {};

/* Referenced so that raft.h's constants reach the object's BTF (TestLayoutMatchesHeader). */
const enum raft_wire *raftwire_btf_wire __attribute__((unused));
const enum raft_flags *raftwire_btf_flags __attribute__((unused));

struct raftwire_result {
	__s32 parse_ret; /* parse_pkt() */
	__u32 reached;   /* 1 when the raft header was looked at (UDP, parsed) */
	enum raft_drop verdict;
	enum raft_msg_type type; /* as received: any byte value */
	__u32 flags;
	__u64 from;
	__u64 to;
	__u64 term;
	__u64 log_term;
	__u64 index;
	__u64 commit;
	__u64 reject_hint;
	__u32 ctx_len;
	__u32 _pad;
	struct raft_hdr hdr; /* the header as received (network order) */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct raftwire_result);
} result SEC(".maps");

SEC("xdp")
int raftwire_xdp(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct raftwire_result *r;
	struct raft_hdr *h;
	struct pkt p = {};
	__u32 zero = 0;

	r = bpf_map_lookup_elem(&result, &zero);
	if (!r)
		return XDP_PASS;
	__builtin_memset(r, 0, sizeof(*r));
	r->parse_ret = parse_pkt(data, data_end, &p);
	if (r->parse_ret != PARSE_OK || p.l4_proto != IPPROTO_UDP)
		return XDP_PASS;
	h = pkt_hdr(data, data_end, p.payload_off, sizeof(*h));
	if (!h) {
		r->reached = 1;
		r->verdict = RAFT_DROP_SHORT;
		return XDP_PASS;
	}
	r->reached = 1;
	__builtin_memcpy(&r->hdr, h, sizeof(*h));
	r->verdict = raft_hdr_check(h, data_end, p.payload_len, raftwire_cfg.cluster_id, raftwire_cfg.self);
	r->type = h->type;
	r->flags = h->flags;
	r->ctx_len = h->ctx_len;
	r->from = bpf_be64_to_cpu(h->from);
	r->to = bpf_be64_to_cpu(h->to);
	r->term = bpf_be64_to_cpu(h->term);
	r->log_term = bpf_be64_to_cpu(h->log_term);
	r->index = bpf_be64_to_cpu(h->index);
	r->commit = bpf_be64_to_cpu(h->commit);
	r->reject_hint = bpf_be64_to_cpu(h->reject_hint);
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
