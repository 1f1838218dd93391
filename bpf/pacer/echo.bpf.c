// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* echo.bpf.c - the pacer's reference consumer, a delayed echo: a UDP datagram to the echo
 * port is stored (its frame, addresses swapped) and sent back from a pacer tick once its
 * delay has passed; one to the carry port rides the pacer itself as a carried packet and is
 * turned around when it comes back due. It uses the whole client interface
 * (bpf/include/pacer_client.h) the way the hedger's two paths and Raft's heartbeats do, and is
 * what internal/pacer's tests and benchmark run (its Go bindings are test-only):
 *   echo_store (TC ingress, echo iface)    echo port: store the datagram, pacer_request(its
 *                                          deadline); carry port: record its deadline,
 *                                          pacer_carry(skb, deadline); drop it either way
 *   echo_tick  (TC ingress, pacer veth)    pacer_receive; a tick: send every due echo (a clone
 *                                          each, several per tick when due), re-arm for the
 *                                          rest; a carried datagram: turned around and sent
 *                                          when due, else pacer_recirculate */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "clock.h"
#include "counters.h"
#include "parse.h"
#include "pacer_client.h"

enum echo_limits {
	ECHO_SLOTS = 32,       /* datagrams waiting at once (the tests send fewer) */
	ECHO_FRAME_MAX = 256,  /* longest stored frame: Ethernet + IPv6 + UDP + 194 bytes */
	ECHO_CARRIED_MAX = 1024, /* carried datagrams waiting at once (LRU: the oldest go first) */
};

struct echo_config {
	__u32 out_ifindex; /* where echoes leave (egress): the echo iface itself */
	__be16 port;       /* UDP destination port that is echoed from a stored copy */
	__be16 carry_port; /* UDP destination port whose datagrams are carried (0: none) */
	__u64 delay_ns;    /* how long a datagram waits */
};

/* A carried datagram: its source port and the 4-byte id its payload starts with. */
struct echo_key {
	__u32 id;
	__be16 sport;
	__u16 _pad;
};

struct echo_slot {
	__u64 deadline_ns;
	__u32 len;
	__u32 busy;
	__u8 frame[ECHO_FRAME_MAX];
};

struct echo_stats {
	__u64 stored;       /* datagrams stored */
	__u64 ring_full;    /* datagram found its slot busy: passed unechoed */
	__u64 too_long;     /* datagram longer than ECHO_FRAME_MAX: passed unechoed */
	__u64 malformed;    /* failed parse.h: passed */
	__u64 ticks;        /* ticks received */
	__u64 ticks_idle;   /* ticks with nothing due */
	__u64 echoes_sent;  /* echoes sent (one clone each) */
	__u64 send_errors;  /* rebuilding or cloning an echo failed: echo lost */
	__u64 rearmed;      /* ticks requested from the tick program */
	__u64 carried;      /* datagrams carried into the pacer */
	__u64 carry_errors; /* pacer_carry failed (or no room for the deadline): not echoed */
	__u64 recirculated; /* carried datagrams back before their deadline: sent round again */
	__u64 carried_unknown; /* carried packets back without a recorded deadline: dropped */
	__u64 rx_malformed; /* malformed tick frames: dropped */
	__u64 echo_late_sum_ns; /* echo sent minus its deadline: sum, count, max */
	__u64 echo_late_count;
	__u64 echo_late_max_ns;
};

const volatile struct echo_config echo_cfg = {};
const enum echo_limits *echo_btf_limits __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, ECHO_SLOTS);
	__type(key, __u32);
	__type(value, struct echo_slot);
} echo_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} echo_head SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct echo_stats);
} echo_counters SEC(".maps");

/* Deadlines of carried datagrams (the consumer's own state: the pacer holds only the clone). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, ECHO_CARRIED_MAX);
	__type(key, struct echo_key);
	__type(value, __u64);
} echo_carried SEC(".maps");

static __always_inline struct echo_stats *echo_stats_get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&echo_counters, &zero);
}

/* echo_len bounds a length already checked to be 1..ECHO_FRAME_MAX by arithmetic the
 * verifier follows: clang folds "len < a || len > b" into one subtract-and-compare on a
 * copy, which leaves the register passed to the helper unbounded on older verifiers (6.12). */
static __always_inline __u32 echo_len(__u32 len)
{
	return ((len - 1) & (ECHO_FRAME_MAX - 1)) + 1;
}

/* swap exchanges n bytes at offsets a and b of a stored frame (bounded for the verifier). */
static __always_inline int swap(__u8 *frame, __u32 a, __u32 b, __u32 n)
{
	if (a > ECHO_FRAME_MAX - 16 || b > ECHO_FRAME_MAX - 16 || n > 16)
		return -1;
	for (__u32 i = 0; i < 16; i++) {
		__u8 x;

		if (i >= n)
			break;
		x = frame[(a + i) & (ECHO_FRAME_MAX - 1)];
		frame[(a + i) & (ECHO_FRAME_MAX - 1)] = frame[(b + i) & (ECHO_FRAME_MAX - 1)];
		frame[(b + i) & (ECHO_FRAME_MAX - 1)] = x;
	}
	return 0;
}

/* turn_around swaps the frame's MACs, IP addresses and UDP ports: the checksums stay right
 * (a sum does not change when two of its terms swap). But the stored bytes may not hold a
 * full UDP checksum at all: a datagram from a local socket over a veth is CHECKSUM_PARTIAL,
 * its checksum field only the pseudo-header sum, and the skb the echo is sent from (a tick,
 * possibly a conveyor filler's clone) does not carry that state. So over IPv4 the echo is
 * sent without a UDP checksum (0, RFC 768); over IPv6, where 0 is not allowed, the stored
 * checksum is kept (right for datagrams that arrived with a full one). */
static __always_inline int turn_around(__u8 *frame, const struct pkt *p)
{
	__u32 a = p->l3_off + (p->l3_proto == ETH_P_IP ? offsetof(struct iphdr, saddr) : offsetof(struct ipv6hdr, saddr));
	__u32 n = p->l3_proto == ETH_P_IP ? 4 : 16;
	__u32 c = p->l4_off + offsetof(struct udphdr, check);

	if (p->l3_proto == ETH_P_IP) {
		if (c > ECHO_FRAME_MAX - 2)
			return -1;
		frame[c & (ECHO_FRAME_MAX - 1)] = 0;
		frame[(c + 1) & (ECHO_FRAME_MAX - 1)] = 0;
	}
	return swap(frame, 0, ETH_ALEN, ETH_ALEN) | swap(frame, a, a + n, n) |
	       swap(frame, p->l4_off, p->l4_off + 2, 2);
}

/* echo_sent counts an echo sent at now for its deadline (lateness: sum, count, max). */
static __always_inline void echo_sent(struct echo_stats *es, __u64 now, __u64 deadline)
{
	__u64 late = now > deadline ? now - deadline : 0;

	if (!es)
		return;
	es->echoes_sent++;
	es->echo_late_sum_ns += late;
	es->echo_late_count++;
	if (late > es->echo_late_max_ns)
		es->echo_late_max_ns = late;
}

/* echo_key_of reads a carried datagram's key (source port, the id its payload starts with). */
static __always_inline int echo_key_of(struct __sk_buff *skb, const struct pkt *p, struct echo_key *k)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->sport = p->sport;
	if (p->payload_len < sizeof(k->id))
		return -1;
	return bpf_skb_load_bytes(skb, p->payload_off, &k->id, sizeof(k->id)) < 0 ? -1 : 0;
}

/* echo_carry records the datagram's deadline, then carries it (the deadline travels with it:
 * on edt it is the clone's delivery time). The datagram itself is dropped. */
static __always_inline int echo_carry(struct __sk_buff *skb, const struct pkt *p, struct echo_stats *es)
{
	struct echo_key k;
	__u64 deadline = kedge_now() + echo_cfg.delay_ns;

	if (echo_key_of(skb, p, &k) < 0) {
		COUNT(es, malformed);
		return TC_ACT_UNSPEC;
	}
	/* Recorded before it is carried: the tick program reads it when the clone is back. */
	if (bpf_map_update_elem(&echo_carried, &k, &deadline, BPF_ANY) < 0 || pacer_carry(skb, deadline) < 0) {
		bpf_map_delete_elem(&echo_carried, &k);
		COUNT(es, carry_errors);
		return TC_ACT_SHOT;
	}
	COUNT(es, carried);
	return TC_ACT_SHOT;
}

SEC("tc")
int echo_store(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct echo_stats *es = echo_stats_get();
	struct echo_slot *s;
	struct pkt p;
	__u32 zero = 0, *head, idx, len;
	int perr;

	perr = parse_pkt(data, data_end, &p);
	if (perr != PARSE_OK) {
		if (perr != PARSE_ERR_L3_PROTO)
			COUNT(es, malformed);
		return TC_ACT_UNSPEC;
	}
	if (p.l4_proto != IPPROTO_UDP)
		return TC_ACT_UNSPEC;
	if (echo_cfg.carry_port && p.dport == echo_cfg.carry_port)
		return echo_carry(skb, &p, es);
	if (p.dport != echo_cfg.port)
		return TC_ACT_UNSPEC;
	len = skb->len;
	if (len > ECHO_FRAME_MAX) {
		COUNT(es, too_long);
		return TC_ACT_UNSPEC;
	}
	head = bpf_map_lookup_elem(&echo_head, &zero);
	if (!head)
		return TC_ACT_UNSPEC;
	idx = __sync_fetch_and_add(head, 1) % ECHO_SLOTS;
	s = bpf_map_lookup_elem(&echo_slots, &idx);
	if (!s || s->busy) {
		COUNT(es, ring_full);
		return TC_ACT_UNSPEC;
	}
	if (len < sizeof(struct ethhdr) || bpf_skb_load_bytes(skb, 0, s->frame, echo_len(len)) < 0 ||
	    turn_around(s->frame, &p) < 0) {
		COUNT(es, malformed);
		return TC_ACT_UNSPEC;
	}
	s->len = len;
	s->deadline_ns = kedge_now() + echo_cfg.delay_ns;
	/* Stored before the request (docs/pacer.md: ordering). */
	__sync_fetch_and_add(&s->busy, 1);
	COUNT(es, stored);
	pacer_request(skb, s->deadline_ns);
	return TC_ACT_SHOT;
}

/* send_echo rebuilds the tick's skb as slot s's frame and clones it out. */
static __always_inline int send_echo(struct __sk_buff *skb, struct echo_slot *s)
{
	__u32 len = s->len;

	if (len < sizeof(struct ethhdr) || len > ECHO_FRAME_MAX)
		return -1;
	len = echo_len(len);
	if (bpf_skb_change_tail(skb, len, 0) < 0 || bpf_skb_store_bytes(skb, 0, s->frame, len, 0) < 0)
		return -1;
	return bpf_clone_redirect(skb, echo_cfg.out_ifindex, 0) < 0 ? -1 : 0;
}

struct echo_scan {
	struct __sk_buff *skb;
	struct echo_stats *es;
	__u64 now;
	__u64 next; /* earliest deadline still pending, 0: none */
	__u32 sent;
};

/* echo_one sends slot idx's echo if it is due (bpf_loop callback: one verifier pass for all
 * slots, where a plain loop's states multiply). */
static long echo_one(__u32 idx, struct echo_scan *c)
{
	struct echo_slot *s = bpf_map_lookup_elem(&echo_slots, &idx);
	struct echo_stats *es = c->es;

	if (!s || !s->busy)
		return 0;
	if (!pacer_due(s->deadline_ns, c->now, 0)) {
		if (!c->next || s->deadline_ns < c->next)
			c->next = s->deadline_ns;
		return 0;
	}
	s->busy = 0;
	if (send_echo(c->skb, s) < 0) {
		COUNT(es, send_errors);
		return 0;
	}
	c->sent++;
	echo_sent(es, c->now, s->deadline_ns);
	return 0;
}

/* swap_skb exchanges n (<= 16) bytes at offsets a and b of the skb. Swapping keeps every
 * checksum right, whatever the skb's checksum state (a sum does not change when two of its
 * terms swap), so a carried datagram from a local socket (CHECKSUM_PARTIAL) stays valid. */
static __always_inline int swap_skb(struct __sk_buff *skb, __u32 a, __u32 b, __u32 n)
{
	__u8 x[16], y[16];

	if (n > 16 || n < 1)
		return -1;
	n = ((n - 1) & 15) + 1;
	if (bpf_skb_load_bytes(skb, a, x, n) < 0 || bpf_skb_load_bytes(skb, b, y, n) < 0 ||
	    bpf_skb_store_bytes(skb, a, y, n, 0) < 0 || bpf_skb_store_bytes(skb, b, x, n, 0) < 0)
		return -1;
	return 0;
}

/* echo_carried_back: a carried datagram back from the pacer. Due: turned around (MACs,
 * addresses, ports) and sent out of the echo iface; not yet: round again, due at its
 * deadline. */
static __always_inline int echo_carried_back(struct __sk_buff *skb, struct echo_stats *es)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct echo_key k;
	struct pkt p;
	__u64 *d, deadline, now;
	__u32 a, n;

	if (parse_pkt(data, data_end, &p) != PARSE_OK || p.l4_proto != IPPROTO_UDP ||
	    echo_key_of(skb, &p, &k) < 0 || !(d = bpf_map_lookup_elem(&echo_carried, &k))) {
		COUNT(es, carried_unknown);
		return TC_ACT_SHOT;
	}
	deadline = *d;
	now = kedge_now();
	if (!pacer_due(deadline, now, 1)) {
		COUNT(es, recirculated);
		return pacer_recirculate(skb, deadline);
	}
	bpf_map_delete_elem(&echo_carried, &k);
	a = p.l3_off + (p.l3_proto == ETH_P_IP ? offsetof(struct iphdr, saddr) : offsetof(struct ipv6hdr, saddr));
	n = p.l3_proto == ETH_P_IP ? 4 : 16;
	if (swap_skb(skb, 0, ETH_ALEN, ETH_ALEN) < 0 || swap_skb(skb, a, a + n, n) < 0 ||
	    swap_skb(skb, p.l4_off, p.l4_off + 2, 2) < 0) {
		COUNT(es, send_errors);
		return TC_ACT_SHOT;
	}
	echo_sent(es, now, deadline);
	return bpf_redirect(echo_cfg.out_ifindex, 0);
}

SEC("tc")
int echo_tick(struct __sk_buff *skb)
{
	struct echo_stats *es = echo_stats_get();
	struct echo_scan c = { .skb = skb, .es = es };
	struct pacer_tick t;

	switch (pacer_receive(skb, &t)) {
	case PACER_RX_MALFORMED:
		COUNT(es, rx_malformed);
		return TC_ACT_SHOT;
	case PACER_RX_CARRIED:
		return echo_carried_back(skb, es);
	}
	COUNT(es, ticks);
	c.now = kedge_now();
	bpf_loop(ECHO_SLOTS, echo_one, &c, 0);
	if (!c.sent)
		COUNT(es, ticks_idle);
	if (c.next && pacer_request(skb, c.next) == PACER_ARMED)
		COUNT(es, rearmed);
	return TC_ACT_SHOT;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
