// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* floor.bpf.c - the floor of `kedge bench sg --scenario loopback` (method "floor"): the
 * cheapest in-kernel scatter-gather that moves the same packets as kedge's, a lower bound
 * for any implementation on that set-up, not a product. It lives only in the bench.
 *
 *   floor_scatter (TC egress, lo)  the client's request to worker 0's port becomes a copy per
 *                                  worker: UDP checksum set to 0 once (IPv4: no checksum),
 *                                  then per worker only the destination port and a
 *                                  bpf_clone_redirect; the original goes to worker 0
 *   floor_gather  (XDP, lo)        a reply to the client's port is dropped and counted in
 *                                  its request's slot (one atomic add); the reply that
 *                                  makes the count reach the fan-out writes the request id
 *                                  to the ring buffer
 *
 * It does no reduction and checks nothing: no duplicate bitmap, no source, group or length
 * check, no timers, no deadline. IPv4 without options, a fan-out of at most
 * FLOOR_WORKERS_MAX workers on consecutive ports. Request ids carry their slot in the low
 * bits (FLOOR_SLOTS), as pkg/sg's do. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "proto.h"

#define FLOOR_SLOTS 1024
#define FLOOR_WORKERS_MAX 256
/* The mark on the copies, so the scatter lets them through on their pass through lo's
 * egress. Laid out as marks.h's registry ('k', sg's 'S'); kept here, not in the registry,
 * because the floor is bench-only. */
#define FLOOR_MARK 0x6b530100

#define FLOOR_ETH_LEN 14
#define FLOOR_L4_OFF (FLOOR_ETH_LEN + 20) /* IPv4 without options */
#define FLOOR_HDR_OFF (FLOOR_L4_OFF + 8)  /* the kedge sg header */
#define FLOOR_REQID_OFF (FLOOR_HDR_OFF + 8)

struct floor_cfg {
	__u32 ifindex;     /* lo's */
	__u32 nworkers;    /* the fan-out */
	__u16 client_port; /* the client socket's port, host order */
	__u16 base_port;   /* worker 0's port; worker i listens on base_port + i */
};

const volatile struct floor_cfg cfg;

/* A completed request, as the ring buffer carries it. */
struct floor_done {
	__u64 req_id;
};

/* Replies counted per slot (request id & (FLOOR_SLOTS - 1)); the scatter zeroes the slot. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, FLOOR_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} floor_counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 << 10);
} floor_ring SEC(".maps");

/* floor_pkt returns the request id of a UDP datagram over IPv4 to port, 0 when the packet
 * is anything else (too short, another protocol or port). */
static __always_inline __u64 floor_pkt(void *data, void *data_end, __u16 port, __u16 src)
{
	struct iphdr *ip = data + FLOOR_ETH_LEN;
	struct udphdr *udp = data + FLOOR_L4_OFF;
	__u64 id;

	if (data + FLOOR_REQID_OFF + sizeof(id) > data_end)
		return 0;
	if (ip->protocol != IPPROTO_UDP || ip->ihl != 5 || udp->dest != bpf_htons(port) ||
	    (src && udp->source != bpf_htons(src)))
		return 0;
	__builtin_memcpy(&id, data + FLOOR_REQID_OFF, sizeof(id));
	return bpf_be64_to_cpu(id);
}

SEC("tc")
int floor_scatter(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *data_end = (void *)(long)skb->data_end;
	struct udphdr *udp = data + FLOOR_L4_OFF;
	__u32 n = cfg.nworkers, slot;
	__u64 id, *count;
	__be16 port;

	if (skb->mark == FLOOR_MARK)
		return TC_ACT_OK; /* a copy, passing again */
	id = floor_pkt(data, data_end, cfg.base_port, cfg.client_port);
	if (!id)
		return TC_ACT_OK;
	slot = id & (FLOOR_SLOTS - 1);
	count = bpf_map_lookup_elem(&floor_counts, &slot);
	if (count)
		*count = 0;
	if ((void *)(udp + 1) > data_end)
		return TC_ACT_OK;
	udp->check = 0;
	skb->mark = FLOOR_MARK;
	for (__u32 i = 1; i < FLOOR_WORKERS_MAX && i < n; i++) {
		port = bpf_htons(cfg.base_port + i);
		bpf_skb_store_bytes(skb, FLOOR_L4_OFF + offsetof(struct udphdr, dest), &port, sizeof(port), 0);
		bpf_clone_redirect(skb, cfg.ifindex, 0);
	}
	port = bpf_htons(cfg.base_port);
	bpf_skb_store_bytes(skb, FLOOR_L4_OFF + offsetof(struct udphdr, dest), &port, sizeof(port), 0);
	return TC_ACT_OK;
}

SEC("xdp")
int floor_gather(struct xdp_md *ctx)
{
	struct floor_done d;
	__u64 *count;
	__u32 slot;

	d.req_id = floor_pkt((void *)(long)ctx->data, (void *)(long)ctx->data_end, cfg.client_port, 0);
	if (!d.req_id)
		return XDP_PASS;
	slot = d.req_id & (FLOOR_SLOTS - 1);
	count = bpf_map_lookup_elem(&floor_counts, &slot);
	if (count && __sync_fetch_and_add(count, 1) + 1 == cfg.nworkers)
		bpf_ringbuf_output(&floor_ring, &d, sizeof(d), 0);
	return XDP_DROP;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
