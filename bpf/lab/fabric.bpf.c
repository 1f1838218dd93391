// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* fabric: the lab's fault program (internal/lab/fabric.go).
 *
 * Attached at TC ingress of every fabric-side veth v<i> of a lab: it sees each packet that
 * host i sends into the fabric, below the hosts' own interfaces (an XDP or TC program on a
 * host's eth0 sees exactly what this program let through, as it would from a wire).
 *
 * The source host is the port's (fab_ports: ifindex -> host index); the destination host is
 * looked up by destination address (fab_hosts: IPv4 v4-mapped or IPv6 -> host index). The
 * rule for the (src, dst) link (fab_links) decides, in this order:
 *   partition  drop every packet of the link (symmetric splits are two one-way rules)
 *   loss       drop with probability loss / 2^32 (bpf_get_prandom_u32)
 *   dup        deliver a second copy with probability dup / 2^32 (bpf_clone_redirect back
 *              into this port's ingress, marked so the copy is not cloned or dropped again)
 *   delay      with probability delay / 2^32 send the packet to the delay device (a tun in
 *              the fabric namespace, fab_cfg.delay_ifindex) whose reader re-injects it after
 *              the link's delay; packets not sent there overtake it: that is reordering.
 * Everything else passes (TCX_NEXT, so a bridge or the router forwards it as usual).
 *
 * Every packet lands in exactly one fab_stats counter, except that a duplicated packet also
 * counts under duplicated (its copy is counted as dup_copy when it comes back). Policy for
 * what the program cannot place: non-IP frames (ARP, LLDP) pass (not_ip), malformed IP
 * headers pass (malformed: the fabric is no firewall), an unknown source port or destination
 * address passes (no_host: the router's own address, multicast). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "counters.h"
#include "marks.h"
#include "parse.h"
#include "proto.h"

/* Set by user space before load (internal/lab). */
struct fab_config {
	__u32 dup_mark;      /* skb->mark of a duplicate copy on its way back in: passed once,
			      * never cloned again (KEDGE_MARK_FABRIC_DUP) */
	__u32 delay_ifindex; /* the delay device; 0: none, delay rules count delay_off and pass */
};

const volatile struct fab_config fab_cfg = { .dup_mark = KEDGE_MARK_FABRIC_DUP };

/* Referenced so that the mark registry reaches the object's BTF (bpf2go -type). */
const enum kedge_mark *fab_btf_mark __attribute__((unused));

struct fab_link_key {
	__u32 src; /* host index (1-based, lab.Host.Index) */
	__u32 dst;
};

/* Probabilities are fractions of 2^32: a packet is hit when bpf_get_prandom_u32() < p. */
struct fab_fault {
	__u32 partition; /* non-zero: drop all */
	__u32 loss;
	__u32 dup;
	__u32 delay;     /* fraction of packets sent to the delay device */
};

struct fab_stats {
	__u64 passed;       /* a rule existed and let the packet through */
	__u64 no_rule;      /* both ends known, no rule for the link */
	__u64 partitioned;
	__u64 lost;
	__u64 duplicated;   /* a copy was sent (the original also passes or is delayed) */
	__u64 dup_failed;   /* bpf_clone_redirect failed: no copy */
	__u64 dup_copy;     /* the copy coming back in, passed */
	__u64 delayed;
	__u64 delay_off;    /* delay rule but no delay device: passed undelayed */
	__u64 delay_failed; /* bpf_redirect to the delay device failed: passed undelayed */
	__u64 not_ip;
	__u64 malformed;
	__u64 no_host;      /* unknown port or destination address */
};

/* Map sizes: a lab has at most 200 hosts (its address plan, lab.Spec), one fabric port and
 * two addresses (IPv4, IPv6) each; a rule per ordered pair of hosts. Rounded up to powers
 * of two. */
#define FAB_PORTS_MAX 256
#define FAB_HOSTS_MAX 1024
#define FAB_LINKS_MAX 65536

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FAB_PORTS_MAX);
	__type(key, __u32); /* ifindex of the fabric-side port */
	__type(value, __u32);
} fab_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FAB_HOSTS_MAX);
	__type(key, struct in6_addr);
	__type(value, __u32);
} fab_hosts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FAB_LINKS_MAX);
	__type(key, struct fab_link_key);
	__type(value, struct fab_fault);
} fab_links SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fab_stats);
} fab_counters SEC(".maps");

/* skb->data and skb->data_end read with one load each at a fixed offset: after a helper
 * call clang otherwise keeps skb + offset in a register, which the verifier refuses. */
#define SKB_LOAD(skb, field)                                                              \
	({                                                                                \
		void *__p;                                                                \
		asm volatile("%0 = *(u32 *)(%1 + %2)"                                     \
			     : "=r"(__p)                                                  \
			     : "r"(skb), "i"(__builtin_offsetof(struct __sk_buff, field))); \
		__p;                                                                      \
	})

static __always_inline int hit(__u32 p)
{
	return p && bpf_get_prandom_u32() < p;
}

/* dst_addr finds the destination address; returns 0 on success, -1 not IP, -2 malformed. */
static __always_inline int dst_addr(void *data, void *data_end, struct in6_addr *dst)
{
	struct hdr_cursor nh = { .pos = data };
	struct ethhdr *eth;
	__u8 flags = 0;
	int proto;

	proto = parse_ethhdr(&nh, data_end, &eth, &flags);
	if (proto == ETH_P_IP) {
		struct iphdr *iph;

		if (parse_iphdr(&nh, data_end, &iph) < 0)
			return -2;
		ipv4_mapped(dst, iph->daddr);
		return 0;
	}
	if (proto == ETH_P_IPV6) {
		struct ipv6hdr *ip6h = nh.pos;

		if ((void *)(ip6h + 1) > data_end || ip6h->version != 6)
			return -2;
		__builtin_memcpy(dst, &ip6h->daddr, sizeof(*dst));
		return 0;
	}
	return proto < 0 && proto != PARSE_ERR_L3_PROTO ? -2 : -1;
}

SEC("tc")
int fabric_ingress(struct __sk_buff *skb)
{
	struct fab_stats *st;
	struct fab_link_key k;
	struct fab_fault *f;
	struct in6_addr dst;
	__u32 zero = 0, ifindex = skb->ifindex, *src, *dsth;
	int err;

	st = bpf_map_lookup_elem(&fab_counters, &zero);
	if (skb->mark == fab_cfg.dup_mark) {
		skb->mark = 0;
		COUNT(st, dup_copy);
		return TCX_NEXT;
	}
	/* Headers of locally sent packets are linear; pull in case a sender's are not. */
	if (SKB_LOAD(skb, data) + sizeof(struct ethhdr) + sizeof(struct ipv6hdr) > SKB_LOAD(skb, data_end))
		bpf_skb_pull_data(skb, sizeof(struct ethhdr) + sizeof(struct ipv6hdr));
	err = dst_addr(SKB_LOAD(skb, data), SKB_LOAD(skb, data_end), &dst);
	if (err == -1) {
		COUNT(st, not_ip);
		return TCX_NEXT;
	}
	if (err < 0) {
		COUNT(st, malformed);
		return TCX_NEXT;
	}
	src = bpf_map_lookup_elem(&fab_ports, &ifindex);
	dsth = bpf_map_lookup_elem(&fab_hosts, &dst);
	if (!src || !dsth) {
		COUNT(st, no_host);
		return TCX_NEXT;
	}
	k.src = *src;
	k.dst = *dsth;
	f = bpf_map_lookup_elem(&fab_links, &k);
	if (!f) {
		COUNT(st, no_rule);
		return TCX_NEXT;
	}
	if (f->partition) {
		COUNT(st, partitioned);
		return TC_ACT_SHOT;
	}
	if (hit(f->loss)) {
		COUNT(st, lost);
		return TC_ACT_SHOT;
	}
	if (hit(f->dup)) {
		__u32 mark = skb->mark;

		skb->mark = fab_cfg.dup_mark;
		if (bpf_clone_redirect(skb, ifindex, BPF_F_INGRESS) == 0)
			COUNT(st, duplicated);
		else
			COUNT(st, dup_failed);
		skb->mark = mark;
	}
	if (hit(f->delay)) {
		if (!fab_cfg.delay_ifindex) {
			COUNT(st, delay_off);
			return TCX_NEXT;
		}
		err = bpf_redirect(fab_cfg.delay_ifindex, 0);
		if (err == TC_ACT_REDIRECT) {
			COUNT(st, delayed);
			return err;
		}
		COUNT(st, delay_failed);
		return TCX_NEXT;
	}
	COUNT(st, passed);
	return TCX_NEXT;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
