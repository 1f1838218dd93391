// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* parsetest: exposes parse.h to BPF_PROG_TEST_RUN. Each entry point parses the packet it is
 * given and stores what parse_pkt() and parse_tcp_ts() returned in the one-slot 'result'
 * map; the Go fixtures in internal/parsetest compare that with the expected parse. Not
 * attached anywhere: it exists for tests, the fuzzer and the parser benchmark. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "parse.h"

struct parse_result {
	__s32 ret;    /* parse_pkt() return: PARSE_OK or enum parse_err */
	__s32 ts_ret; /* parse_tcp_ts(): 0 found, -1 not found or not TCP */
	__u32 tsval;
	__u32 tsecr;
	struct pkt pkt;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct parse_result);
} result SEC(".maps");

/* Referenced so that parse.h's enums reach the object's BTF (TestParseEnumsMatchBTF). */
const enum parse_err *parsetest_btf_parse_err __attribute__((unused));
const enum pkt_flags *parsetest_btf_pkt_flags __attribute__((unused));

static __always_inline void run_parse(void *data, void *data_end)
{
	__u32 zero = 0;
	struct parse_result *r = bpf_map_lookup_elem(&result, &zero);

	if (!r)
		return;
	r->ret = parse_pkt(data, data_end, &r->pkt);
	r->ts_ret = -1;
	r->tsval = 0;
	r->tsecr = 0;
	if (r->ret == PARSE_OK && r->pkt.l4_proto == IPPROTO_TCP) {
		struct tcphdr *tcph = pkt_hdr(data, data_end, r->pkt.l4_off, sizeof(*tcph));

		if (tcph)
			r->ts_ret = parse_tcp_ts(tcph, data_end, &r->tsval, &r->tsecr);
	}
}

SEC("tc")
int parse_tc(struct __sk_buff *skb)
{
	run_parse((void *)(long)skb->data, (void *)(long)skb->data_end);
	return TC_ACT_UNSPEC;
}

SEC("xdp")
int parse_xdp(struct xdp_md *ctx)
{
	run_parse((void *)(long)ctx->data, (void *)(long)ctx->data_end);
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
