// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* fixture: a small stateful program that exercises every part of the BPF_PROG_TEST_RUN
 * fixture style of internal/bpftest (verdict, output bytes, skb mark out, map effects,
 * counters, the fixed clock of clock.h). Not attached anywhere: internal/bpftest's own tests
 * run it.
 *
 * For an Ethernet frame with at least 8 bytes after the header it writes kedge_now() (host
 * byte order) over those 8 bytes, records the time under the packet's skb->mark in 'seen',
 * sets skb->mark to mark + 1 and returns TC_ACT_OK; shorter frames are dropped
 * (TC_ACT_SHOT) and counted. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "clock.h"

#define TC_ACT_OK 0
#define TC_ACT_SHOT 2
#define SEEN_MAX 16 /* marks a fixture uses */

struct fixture_counters {
	__u64 stamped;
	__u64 short_frame;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fixture_counters);
} counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SEEN_MAX);
	__type(key, __u32);   /* skb->mark on entry */
	__type(value, __u64); /* kedge_now() at the run */
} seen SEC(".maps");

SEC("tc")
int stamp(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *data_end = (void *)(long)skb->data_end;
	__u64 *at = data + sizeof(struct ethhdr);
	__u32 zero = 0, mark = skb->mark;
	struct fixture_counters *c = bpf_map_lookup_elem(&counters, &zero);
	__u64 now = kedge_now();

	if (!c)
		return TC_ACT_SHOT;
	if ((void *)(at + 1) > data_end) {
		c->short_frame++;
		return TC_ACT_SHOT;
	}
	*at = now;
	bpf_map_update_elem(&seen, &mark, &now, BPF_ANY);
	skb->mark = mark + 1;
	c->stamped++;
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
