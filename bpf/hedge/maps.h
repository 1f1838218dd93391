/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* maps.h - the hedger's run configuration, maps and counters (bpf/include/hedge.h has the
 * types): what every stage of bpf/hedge shares. */
#ifndef KEDGE_HEDGE_MAPS_H
#define KEDGE_HEDGE_MAPS_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "counters.h"
#include "marks.h"
#include "hedge.h"

/* Scoreboard size: entries live about one hedge delay (longer for hedged requests, until
 * the second response or the TTL). 65536 covers 100k req/s at 500 ms lifetimes; LRU so a
 * full map evicts the oldest entry instead of failing, and an evicted request is simply not
 * hedged (its clone finds no entry and is dropped). User space resizes it before load. */
#define SCOREBOARD_SIZE 65536

/* Set by user space before load (Hedger.load); the defaults only serve tests that load the
 * object without setting it. */
const volatile struct hedge_config cfg = {
	.hedge_mark = KEDGE_MARK_HEDGE,
	.ttl_ns = 5000000000ULL,
	.tick_ns = 3000000000ULL,
	.store_rings = SVC_MAX / 2, /* store_ring's default size: two rings each */
};

/* Enums referenced here so their BTF reaches bpf2go (-type); nothing reads these. */
const enum hedge_limits *hedge_btf_limits __attribute__((unused));
const enum delay_mode *hedge_btf_delay_mode __attribute__((unused));
const enum req_state *hedge_btf_req_state __attribute__((unused));
const enum reqid_order *hedge_btf_reqid_order __attribute__((unused));
const enum budget_mode *hedge_btf_budget_mode __attribute__((unused));
const enum kedge_mark *hedge_btf_mark __attribute__((unused));
const enum hedge_event_type *hedge_btf_event_type __attribute__((unused));
const enum hedge_refusal *hedge_btf_refusal __attribute__((unused));
const enum lap_state *hedge_btf_lap_state __attribute__((unused));
const struct hedge_event *hedge_btf_event __attribute__((unused));

#ifndef READ_ONCE
#define READ_ONCE(x) (*(volatile typeof(x) *)&(x))
#endif

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SVC_MAX);
	__type(key, struct svc_key);
	__type(value, __u32); /* service index */
} services SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SVC_MAX * (REPLICA_MAX + 1));
	__type(key, struct svc_key);
	__type(value, struct replica_ref);
} replicas SEC(".maps");

/* A per-CPU cache of the last address each direction matched (key MATCH_REQUEST: services,
 * MATCH_RESPONSE: replicas; match.h, addr_lookup), in front of the hash lookups. An entry is
 * valid while its gen equals lookup_gen[0], which user space raises after every change to
 * services or replicas (Hedger.bumpLookupGen); gen 0 is never valid. */
struct addr_cache {
	struct svc_key k;
	struct replica_ref ref;
	__u32 gen;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct addr_cache);
} addr_cache SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} lookup_gen SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SVC_MAX);
	__type(key, __u32);
	__type(value, struct svc_cfg);
} svc_cfgs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SVC_MAX);
	__type(key, __u32);
	__type(value, struct svc_state);
} svc_states SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SCOREBOARD_SIZE);
	__type(key, struct hreq_key);
	__type(value, struct hreq);
} scoreboard SEC(".maps");

/* The stored path (store.h, tick.h): per service two rings of STORE_RING cells, its store
 * ring (ring id svc) and its park ring (ring id cfg.store_rings + svc), cell index
 * ring * STORE_RING + position % STORE_RING, and their head and tail positions. User space
 * sizes store_ring to its services before load (a hedger of one service holds two rings) and
 * sets cfg.store_rings to match. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SVC_MAX * STORE_RING);
	__type(key, __u32);
	__type(value, struct hstore);
} store_ring SEC(".maps");

/* The cells' laps and owners, index as store_ring's (struct store_lap); sized with it. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SVC_MAX * STORE_RING);
	__type(key, __u32);
	__type(value, struct store_lap);
} store_laps SEC(".maps");

/* store_len bounds a length already checked to be 1..STORE_BYTES for the verifier (see
 * echo_len in bpf/pacer/echo.bpf.c). */
static __always_inline __u32 store_len(__u32 len)
{
	return ((len - 1) & (STORE_BYTES - 1)) + 1;
}

/* Head and tail 64 bytes apart, on cache lines of their own: the splitter moves the tail on
 * one CPU while the response path moves the head on the other (at saturation, the client's
 * and the server's). */
struct store_pos {
	__u64 head;    /* next position the rescuer (or a response) pops */
	__u32 ticking; /* a tick is at this ring (tick.h, tick_one): one at a time */
	__u32 _pad0;
	__u64 _pad1[6];
	__u64 tail; /* next position a splitter claims */
	__u64 _pad2[7];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * SVC_MAX);
	__type(key, __u32);
	__type(value, struct store_pos);
} store_heads SEC(".maps");

/* A pacer tick's loop state (tick.h, store_tick): per CPU, reset at each tick. The tick's
 * time is kept here too, not in the loop's context on hedge_rescue's stack: that frame is
 * the first of every call chain the verifier adds up (hedge_rescue -> rescue_clone ->
 * pick_for, hedge_rescue -> tick_one -> store_hedge -> pick_for), and Linux 6.1 refuses a
 * chain above 512 bytes, each frame rounded up to 32. */
struct tick_state {
	__u64 next; /* earliest deadline still waiting (0: none) */
	__u32 ring; /* ring being popped (store.h: the store rings, then the park rings) */
	__u32 sent; /* hedges sent in this tick */
	__u32 held; /* the skb holds a hedge, sent when the tick ends (or flushed before the next) */
	__u32 more; /* due cells left when the tick ended */
	__u64 now;  /* the tick's time (one clock read per tick) */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tick_state);
} tick_state SEC(".maps");

/* tick_state_get: this CPU's tick state (a per-CPU array lookup, inlined by the verifier). */
static __always_inline struct tick_state *tick_state_get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&tick_state, &zero);
}

struct khist {
	__u32 b[HIST_BUCKETS];
};

/* Latency histograms: index svc * (HIST_SLOTS + 1) + slot; slot HIST_SLOTS is the running
 * total over the window. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SVC_MAX * (HIST_SLOTS + 1));
	__type(key, __u32);
	__type(value, struct khist);
} lat_hist SEC(".maps");

/* Delay-line precision: index svc * 2 (hedge sent late by x us) and svc * 2 + 1 (early). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SVC_MAX * 2);
	__type(key, __u32);
	__type(value, struct khist);
} dl_precision SEC(".maps");

/* Per-service counters; slot SVC_MAX holds what belongs to no service. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SVC_MAX + 1);
	__type(key, __u32);
	__type(value, struct hedge_stats);
} stats SEC(".maps");

/* The event stream (hedge_config.events; events.h). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, EVENTS_BYTES);
} hedge_events SEC(".maps");

struct hedge_tick {
	struct bpf_timer timer;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct hedge_tick);
} ticker SEC(".maps");

static __always_inline struct hedge_stats *stats_for(__u32 svc)
{
	return bpf_map_lookup_elem(&stats, &svc);
}

/* The counters of no service: malformed packets, fragments, expiry, unmatched clones. */
static __always_inline struct hedge_stats *stats_global(void)
{
	return stats_for(SVC_MAX);
}

#endif /* KEDGE_HEDGE_MAPS_H */
