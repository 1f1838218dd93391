/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* maps.h - pping's configuration, maps, counters and event output. */
#ifndef KEDGE_PPING_MAPS_H
#define KEDGE_PPING_MAPS_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "clock.h"
#include "counters.h"
#include "pping.h"

/* Set by user space before loading; the verifier prunes what it switches off. */
const volatile struct pp_config pp_cfg = {};

/* Referenced so that these enums reach the object's BTF: bpf2go generates pp_consts and
 * pp_event_type for internal/pping, TestMirrorMatchesBTF compares its typed enums. */
const enum pp_consts *pp_btf_consts __attribute__((unused));
const enum pp_event_type *pp_btf_event_type __attribute__((unused));
const enum pp_id_type *pp_btf_id_type __attribute__((unused));
const enum pp_flow_event_type *pp_btf_flow_event_type __attribute__((unused));
const enum pp_flow_reason *pp_btf_flow_reason __attribute__((unused));
const enum pp_flow_source *pp_btf_flow_source __attribute__((unused));
const enum pp_map_id *pp_btf_map_id __attribute__((unused));
const enum pp_agg_side *pp_btf_agg_side __attribute__((unused));
const enum pp_spin_state *pp_btf_spin_state __attribute__((unused));
const enum kedge_clock_consts *pp_btf_clock_consts __attribute__((unused));
const enum pp_hook *pp_btf_hook __attribute__((unused));
const enum parse_err *pp_btf_parse_err __attribute__((unused));

#define pp_debug(fmt, ...)                                  \
	do {                                                \
		if (pp_cfg.debug)                           \
			bpf_printk("pping: " fmt, ##__VA_ARGS__); \
	} while (0)

/* Outstanding identifiers -> time stored (CLOCK_MONOTONIC ns). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PP_MAX_PKT_TS);
	__type(key, struct pp_pkt_id);
	__type(value, __u64);
} pkt_ts SEC(".maps");

/* Canonical flow tuple (see pp_src_sorts_first()) -> state of both directions. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PP_MAX_FLOWS);
	__type(key, struct pp_tuple);
	__type(value, struct pp_flow_state);
} flows SEC(".maps");

/* UDP service port (network order) -> where its request id is (reqid.h). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PP_MAX_SERVICES);
	__type(key, __u16);
	__type(value, struct reqid_spec);
} services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, PP_RINGBUF_BYTES);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PP_HOOK_NR);
	__type(key, __u32);
	__type(value, struct pp_counters);
} counters SEC(".maps");

/* Aggregation: two buffers per address family. agg_active[0] names the buffer the programs
 * write (0 or 1); user space flips it, waits for an RCU grace period (every program that
 * read the old value has finished), then reads and clears the other one. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} agg_active SEC(".maps");

#define PP_AGG_MAP(name, keytype)                          \
	struct {                                           \
		__uint(type, BPF_MAP_TYPE_PERCPU_HASH);    \
		__uint(max_entries, 2 * (PP_MAX_SUBNETS + 1)); \
		__uint(map_flags, BPF_F_NO_PREALLOC);      \
		__type(key, keytype);                      \
		__type(value, struct pp_agg_stats);        \
	} name SEC(".maps")

PP_AGG_MAP(agg4_0, struct pp_agg_key4);
PP_AGG_MAP(agg4_1, struct pp_agg_key4);
PP_AGG_MAP(agg6_0, struct pp_agg_key6);
PP_AGG_MAP(agg6_1, struct pp_agg_key6);

/* Per hash slot of request directions (see PP_HINT_BITS): their outstanding identifiers
 * (incremented when one is stored, decremented when it is matched, sent again or expired,
 * always together with the direction's outstanding count) and their directions waiting to
 * be opened (incremented when one becomes WAITOPEN, decremented when it opens, closes or
 * expires). */
__u32 pp_hint[PP_HINT_SLOTS] = {};

/* The hint slot of a request direction from its parts: the last words of its source and
 * destination addresses (v4-mapped for IPv4), the XOR of their third words (0 for IPv4:
 * both are the v4-mapped prefix), its source and destination ports (network order), the
 * protocol. pp_fast_segment() hashes a packet's directions straight from its
 * headers with it. */
static __always_inline __u32 pp_hint_hash(__u32 s3, __u32 d3, __u32 x2, __u16 sport, __u16 dport,
					  __u8 proto)
{
	__u32 h = s3 * 0x9e3779b1U;

	h ^= d3 * 0x85ebca77U;
	h ^= x2 * 0xc2b2ae3dU;
	h ^= ((__u32)sport << 16 | dport) * 0x27d4eb2fU;
	h ^= proto;
	return (h ^ (h >> 15)) & (PP_HINT_SLOTS - 1);
}

/* The hint slot of a request direction: the addresses' last words, the ports, mixed. */
static __always_inline __u32 pp_hint_slot(const struct pp_tuple *t)
{
	return pp_hint_hash(t->saddr.in6_u.u6_addr32[3], t->daddr.in6_u.u6_addr32[3],
			    t->saddr.in6_u.u6_addr32[2] ^ t->daddr.in6_u.u6_addr32[2],
			    t->sport, t->dport, t->proto);
}

static __always_inline void pp_hint_add(const struct pp_tuple *t, int delta)
{
	__sync_fetch_and_add(&pp_hint[pp_hint_slot(t)], delta);
}

/* The direction cache: per hash slot of packet directions (pp_hint_slot(), the slot of the
 * packet's own direction), the last TCP direction whose data segments may skip the flow table.
 * Most segments of a bulk flow sampled every 100 ms repeat the TSval of the segment before
 * (a TSval lasts a tick of the sender's clock, 1 ms on Linux, tens of segments) and find
 * nothing to match in the reverse direction: all the flow state tells them is "not new", and
 * all they write is their direction's packet and byte counts and its last-seen time. A slot
 * remembers that answer for one direction - the TSval its flow state holds, since when - and
 * takes the counts (pending, folded into the flow state by the direction's next packet that
 * goes the full way); a data segment with that TSval, whose reverse direction's hint slot is
 * zero, is decided on the slot alone (flow.h's pp_dc_hit()), without hashing the 40-byte key
 * and walking the flow table's bucket. Filled only by the full path, for a direction that is
 * open or waiting to open, not local, and not timing its packets in ns (ns_seen); emptied
 * when any of that changes (FIN/RST, the flow's deletion), and trusted for PP_DC_TICKS ticks
 * after it was filled. Readers of the counts (samples, the collector) add the pending ones.
 * One cache line per slot; 4096 slots (256 KiB) like the hints; a collision costs the
 * evicted direction one flow lookup (its pending counts are folded) and then the full path. */
struct pp_dc_slot {
	struct pp_tuple dir; /* the direction; proto 0: empty */
	__u32 last_id;       /* the TSval the direction's flow state has as its last one */
	__u32 filled;        /* jiffies (low 32 bits) when the full path last filled the slot */
	__u32 seen;          /* jiffies (low 32 bits) of the last segment counted here */
	__u32 pkts;          /* segments counted here, not yet in the flow state */
	__u64 bytes;         /* and their payload bytes */
};

/* How long a slot is trusted after its fill, in ticks of jiffies (128 ms at HZ 250): a bound
 * on how stale the flow state's counts and last-seen time can get when a TSval does not move. */
#define PP_DC_TICKS 32

struct pp_dc_slot pp_dc[PP_HINT_SLOTS] = {};

/* Zeroed templates for new entries (a map value may be the source of an update, and a
 * 370-byte or 900-byte struct does not belong on the 512-byte stack). The flow's is bytes:
 * a global of a type that holds a bpf_spin_lock would give .bss a lock of its own on
 * kernels that look for them in global data. */
__u8 pp_zero_flow[sizeof(struct pp_flow_state)] = {};
struct pp_agg_stats pp_zero_agg = {};

/* Last map-full warning per map, so a full map costs one event per second, not one per
 * packet. Racy across CPUs by design: an extra warning is harmless. */
__u64 pp_last_warn[PP_MAP_NR] = {};
#define PP_WARN_INTERVAL_NS 1000000000ULL

static __always_inline struct pp_counters *pp_counters_get(__u32 hook)
{
	return bpf_map_lookup_elem(&counters, &hook);
}

static __always_inline void pp_count_parse_err(struct pp_counters *cnt, int err)
{
	__u32 i = -err;

	if (i < PARSE_ERR_MAX)
		COUNT(cnt, parse_err[i]);
}

/* An RTT sample: flow is the reply's direction; sent/rec the request direction's packets
 * and payload bytes and the reverse direction's. */
struct pp_sample_out {
	__u64 rtt, min_rtt, srtt;
	__u64 sent_pkts, sent_bytes, rec_pkts, rec_bytes;
	__u64 id;
	__u8 id_len;
	__u8 on_egress;
};

static __always_inline void pp_send_rtt(struct pp_counters *cnt, const struct pp_tuple *flow,
					__u64 now, const struct pp_sample_out *o)
{
	struct pp_rtt_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e) {
		COUNT(cnt, event_dropped);
		return;
	}
	e->type = PP_EVENT_RTT;
	e->timestamp = now;
	e->flow = *flow;
	e->rtt = o->rtt;
	e->min_rtt = o->min_rtt;
	e->srtt = o->srtt;
	e->sent_pkts = o->sent_pkts;
	e->sent_bytes = o->sent_bytes;
	e->rec_pkts = o->rec_pkts;
	e->rec_bytes = o->rec_bytes;
	e->id = o->id;
	e->match_on_egress = o->on_egress;
	e->id_len = o->id_len;
	__builtin_memset(e->_pad, 0, sizeof(e->_pad));
	bpf_ringbuf_submit(e, 0);
}

static __always_inline void pp_send_flow(struct pp_counters *cnt, const struct pp_tuple *flow,
					 __u64 now, __u8 event, __u8 reason, __u8 source)
{
	struct pp_flow_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);

	if (!e) {
		COUNT(cnt, event_dropped);
		return;
	}
	e->type = PP_EVENT_FLOW;
	e->timestamp = now;
	e->flow = *flow;
	e->event = event;
	e->reason = reason;
	e->source = source;
	__builtin_memset(e->_pad, 0, sizeof(e->_pad));
	bpf_ringbuf_submit(e, 0);
}

/* Reports a full map, at most once per PP_WARN_INTERVAL_NS per map. */
static __always_inline void pp_warn_full(struct pp_counters *cnt, const struct pp_tuple *flow,
					 __u64 now, __u32 map)
{
	struct pp_map_full_event *e;
	__u64 *last;

	if (map >= PP_MAP_NR)
		return;
	last = &pp_last_warn[map];
	if (*last && now - *last < PP_WARN_INTERVAL_NS)
		return;
	*last = now;
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		COUNT(cnt, event_dropped);
		return;
	}
	e->type = PP_EVENT_MAP_FULL;
	e->timestamp = now;
	e->flow = *flow;
	e->map = map;
	__builtin_memset(e->_pad, 0, sizeof(e->_pad));
	bpf_ringbuf_submit(e, 0);
}

#endif /* KEDGE_PPING_MAPS_H */
