/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* hedge.h - the kernel/user contract of kedge's UDP request hedger.
 *
 * Data flow (bpf/hedge/hedge.bpf.c lists the stages; docs/hedging.md has the picture):
 *   client iface egress  (hedge_split)  : request -> scoreboard PENDING, takes a budget token;
 *                                         payload <= store_limit: stored (store ring, a pacer
 *                                         tick asked for at its deadline), else a clone carried
 *                                         through the pacer with its deadline (no token:
 *                                         NOCLONE, neither)
 *   pacer ns             (the pacer's own programs, bpf/pacer): the clone waits (conveyor |
 *                                         netem | edt), comes back; ticks come at deadlines
 *   pacer veth ingress   (hedge_rescue) : a tick: every due stored request -> its hedge, rebuilt
 *                                         from its bytes; a clone: answered -> dropped, token
 *                                         back; early -> round again; due -> rewritten to
 *                                         another replica and sent (the token pays for it)
 *   client iface ingress (hedge_resp)   : first response completes, rewritten to the address
 *                                         the client used; the later duplicate is dropped
 * Go gets these structs and enums through bpf2go (-type), never by hand; keep padding
 * explicit. */
#ifndef KEDGE_HEDGE_H
#define KEDGE_HEDGE_H

#include "reqid.h"
#include "proto.h"

/* Sizes and sentinels of the contract. An enum, not #defines, so that bpf2go carries them
 * to Go (-type hedge_limits) and nothing is mirrored by hand. */
enum hedge_limits {
	/* Services per hedger. A service is one address:port clients send to, plus its replicas. */
	SVC_MAX = 64,
	/* Replicas per service (gRPC caps hedging at 5 attempts; 8 leaves room). */
	REPLICA_MAX = 8,
	/* Replica index meaning "not a replica" (a service address that is only a VIP). */
	REPLICA_NONE = 0xff,
	/* pick_replica's answer when replicas without a copy remain but every one is ejected
	 * (replica judgement): hedging to them pauses. */
	REPLICA_OUT = 0xfe,
	/* Latency histograms: hist.h's log-linear buckets in microseconds, 16 per power of two
	 * (6% wide), one per microsecond below 16 us, up to 2^28 us (268 s; the last bucket also
	 * holds every larger value). The layout is (HIST_SUB_BITS, HIST_MIN_SHIFT, HIST_BUCKETS). */
	HIST_SUB_BITS = 4,
	HIST_SUB = 1 << HIST_SUB_BITS,
	HIST_MIN_SHIFT = 4,
	HIST_BUCKETS = 400,
	/* Sliding window for the adaptive delay: HIST_SLOTS rotating histograms (Finagle's 30 s
	 * window refreshed every 3 s is 10 slots), plus one running total per service. */
	HIST_SLOTS = 10,
	/* Windowed budget: the window is BUDGET_SLOTS slots of svc_cfg.budget_slot_ns. */
	BUDGET_SLOTS = 10,
	/* Hedges per request at most (gRPC's maxAttempts is 5: the request and 4 hedges). */
	MAX_HEDGES = 4,
	/* Stored path (bpf/hedge/store.h): a store cell holds a request's IP and UDP headers and
	 * payload, STORE_BYTES at most; so a payload of STORE_PAYLOAD_MAX fits over IPv6 (a
	 * 1500-byte MTU's IPv4 datagram, 1472 bytes of payload, fits too). */
	STORE_BYTES = 2048,
	STORE_PAYLOAD_MAX = 2000,
	/* Cells of each service's store ring (a power of two): requests waiting for their hedge
	 * deadline at once; more go the clone path (store_full). */
	STORE_RING = 1024,
	/* A store ring this deep (tail - head) with a pending request at its head: the first
	 * response behind it moves that request into the service's park ring (store.h,
	 * store_park), so the answered cells behind a stalled request leave the ring and a
	 * response's search of it stays short. Above the 64 requests a closed-loop client of 64
	 * loops keeps outstanding, so an unstalled service rarely parks. */
	STORE_PARK_DEPTH = 64,
	/* Hedges one pacer tick sends at most; more due ones wait for the next tick (at once). */
	TICK_HEDGES_MAX = 64,
	/* The hedgeable rule (bpf/hedge/hedgeable.h): alternatives per service, and the bytes
	 * one alternative compares (memcached's preset needs six: get, gets and four binary
	 * get opcodes). */
	HEDGE_RULES_MAX = 8,
	HEDGE_RULE_BYTES = 8,
	/* Replica judgement: the longest back-off is the base doubled this many times. */
	EJECT_LEVEL_MAX = 16,
	/* The event stream's ring buffer (hedge_config.events): 256 KiB holds about 4000
	 * events of 64 bytes (56 and the ring's header), more than a budget lets hedges burst
	 * between two wake-ups of the user-space reader. Without events user space shrinks it
	 * to a page. */
	EVENTS_BYTES = 256 * 1024,
};

/* What an event (hedge_config.events) reports. */
enum hedge_event_type {
	HEDGE_EV_SENT = 1,    /* a hedge left for replica */
	HEDGE_EV_WON = 2,     /* the first response of a hedged request came from a hedge's replica */
	HEDGE_EV_LOST = 3,    /* ... from the replica the client addressed: the hedge was for nothing */
	HEDGE_EV_REFUSED = 4, /* a due hedge not sent: reason says why */
};

/* Why a due hedge was refused (HEDGE_EV_REFUSED). */
enum hedge_refusal {
	HEDGE_REFUSED_BUDGET = 1,   /* the budget (budget_exhausted) */
	HEDGE_REFUSED_EJECTED = 2,  /* every replica without a copy is ejected (replicas_out) */
	HEDGE_REFUSED_OVERDUE = 3,  /* far overdue (overdue_dropped) */
};

/* One event of the stream (ring buffer hedge_events). */
struct hedge_event {
	__u64 time_ns;        /* CLOCK_MONOTONIC */
	__u64 latency_ns;     /* WON/LOST: request to first response; SENT: request to hedge */
	struct in6_addr caddr; /* the client */
	__u64 id;             /* the request id */
	__be16 cport;
	__u16 svc;
	__u8 type;            /* enum hedge_event_type */
	__u8 replica;         /* SENT: where it went; WON/LOST: who answered first */
	__u8 hedges;          /* hedges of the request so far */
	__u8 reason;          /* REFUSED: enum hedge_refusal */
	__u32 _pad[2];
};

/* One alternative of a service's hedgeable rule: a request is hedgeable when the len bytes
 * at offset (from the first byte of the UDP payload), ANDed with mask, equal value (masked
 * already). Bytes past len are 0 in both. */
struct hedge_rule {
	__u16 offset;
	__u8 len;          /* 1..HEDGE_RULE_BYTES */
	__u8 _pad[5];
	__u8 mask[HEDGE_RULE_BYTES];
	__u8 value[HEDGE_RULE_BYTES];
};

/* How a service's hedges are budgeted (docs/hedging.md, Budget). */
enum budget_mode {
	/* Finagle's maxExtraLoad: hedges <= ratio x requests over a sliding window, plus a floor
	 * of burst hedges, charged when a hedge is sent. */
	BUDGET_WINDOW = 0,
	/* A token bucket: each request deposits ratio tokens up to burst, a clone takes one. */
	BUDGET_BUCKET = 1,
};

/* How a hedge's replica is chosen among those a request has not tried yet (bpf/hedge/replica.h,
 * docs/hedging.md, Replica choice). */
enum replica_choice {
	/* Round robin over the untried replicas (the default). */
	REPLICA_RR = 0,
	/* The untried replica with the lowest recent median latency; one without an estimate
	 * (cold) first. */
	REPLICA_P50 = 1,
};

/* hedge_config: the run's constants, set by user space before load (one const volatile,
 * `cfg` in bpf/hedge/maps.h; Go writes it whole through the generated hedgeHedgeConfig). */
struct hedge_config {
	__u32 out_ifindex;     /* client interface hedges leave through */
	__u32 hedge_mark;      /* skb->mark on hedges: never cloned again */
	__u64 ttl_ns;          /* scoreboard entry lifetime */
	__u64 tick_ns;         /* adaptive-delay refresh and GC period */
	__u32 no_carry;        /* 1: the pacer carries nothing (every service's store_limit
				* covers the interface's MTU): a request the store cannot
				* take is not hedged instead of cloned */
	__u32 events;          /* 1: hedges sent, won, lost and refused go to hedge_events */
	__u32 store_rings;     /* store rings (service slots) user space sized store_ring for:
				* ring svc is svc's store ring, ring store_rings + svc its park
				* ring (store.h) */
	__u32 _pad0;
};

enum delay_mode {
	DELAY_FIXED = 0,
	DELAY_QUANTILE = 1,
};

struct svc_addr {
	struct in6_addr addr; /* IPv4 as ::ffff:a.b.c.d (parse.h's shape) */
	__be16 port;
	__u16 _pad;
};

/* services map key: what a request's destination is matched on. */
struct svc_key {
	struct svc_addr a;
};

/* replicas map value: which service (and which replica) a response source belongs to. */
struct replica_ref {
	__u16 svc;
	__u8 index;  /* into svc_cfg.replicas, or REPLICA_NONE for a VIP-only service address */
	__u8 is_svc; /* 1 when this address is the service address itself */
};

/* svc_cfg: written by user space, read by every program. delay_ns is also written by the
 * adaptive-delay timer (DELAY_QUANTILE). */
struct svc_cfg {
	__u8 enabled;
	__u8 mode;       /* enum delay_mode */
	__u8 nreplicas;
	__u8 orig_index; /* replica index of the service address, or REPLICA_NONE */
	struct reqid_spec reqid;
	__u64 delay_ns;      /* current hedge delay */
	__u64 min_ns;        /* DELAY_QUANTILE clamps */
	__u64 max_ns;
	__u32 quantile_pm;   /* quantile in per mille (950 = p95) */
	__u32 min_samples;   /* keep delay_ns until the window holds this many samples */
	__u64 budget_ratio_milli; /* hedges (milli) per request: 50 = 5% extra load */
	__u64 budget_cap_milli;   /* burst * 1000: bucket size, or the window's floor */
	__u64 budget_slot_ns;     /* BUDGET_WINDOW: window / BUDGET_SLOTS */
	__u32 budget_mode;        /* enum budget_mode */
	__u8 max_hedges;          /* hedges per request, 1..MAX_HEDGES */
	__u8 replica_choice;      /* enum replica_choice */
	__u16 _pad;
	struct svc_addr replicas[REPLICA_MAX];
	__u32 store_limit;        /* largest UDP payload the stored path takes (0: clone path only) */
	__u32 nrules;             /* alternatives in rules; 0: every request is hedgeable */
	struct hedge_rule rules[HEDGE_RULES_MAX];
	/* Replica judgement (bpf/hedge/replica.h): a replica that has not answered its last
	 * eject_after hedges, the last of them sent over judge_ns ago, or whose median latency is
	 * above the delay and slow_factor times the best other hedge target's (0: off), gets no
	 * hedges for eject_base_ns, doubled with each ejection in a row up to eject_max_ns. */
	__u32 eject_after;        /* 0: replicas are never ejected */
	__u32 slow_factor;
	__u64 judge_ns;
	__u64 eject_base_ns;
	__u64 eject_max_ns;
};

/* svc_state: kernel-owned running state per service. Grouped by who writes it, because at
 * saturation the splitter runs on the client's CPU and the response path on the server's:
 * the splitter's fields (every request), then fields written at hedges and by the timer (at
 * least 64 bytes: no cache line holds both a splitter's and a response path's field), then
 * the response path's (every response), then 64 bytes so the next service's splitter fields
 * share no line with them either. */
struct svc_state {
	/* The splitter's. */
	__s64 tokens_milli; /* hedging budget; a hedge costs 1000 */
	/* BUDGET_WINDOW: per slot of the window its time index (now / budget_slot_ns + 1;
	 * 0: unused), requests and hedges. */
	__u64 win_epoch[BUDGET_SLOTS];
	__u64 win_requests[BUDGET_SLOTS];
	__u64 win_hedges[BUDGET_SLOTS];
	/* At hedges and timer ticks. */
	__u32 rr;           /* round-robin over alternative replicas */
	__u32 _pad0;
	__u64 last_delay_ns;
	/* Replica judgement, per replica: when the eject_after-th unanswered hedge left,
	 * ejected until (0: in), ejections in all (rep_unanswered and rep_level below). */
	__u64 rep_judge_from_ns[REPLICA_MAX];
	__u64 rep_out_until_ns[REPLICA_MAX];
	__u64 rep_ejections[REPLICA_MAX];
	/* The response path's. */
	__u64 window_count; /* samples in the running total */
	__u32 slot;         /* current histogram slot (the timer moves it) */
	__u32 _pad1;
	/* Per replica: its recent median latency (a stochastic median estimate, replica.h;
	 * 0: none yet) and the responses it gave since the last timer tick. */
	__u64 rep_p50_ns[REPLICA_MAX];
	__u32 rep_samples[REPLICA_MAX];
	/* Replica judgement, per replica: hedges sent since its last response, ejections in a
	 * row (the back-off's doubling); a response sets both to 0 (when they are not). */
	__u32 rep_unanswered[REPLICA_MAX];
	__u32 rep_level[REPLICA_MAX];
	__u64 _pad_end[8];
};

/* Scoreboard key: (client addr, client port, service, request id). */
struct hreq_key {
	struct in6_addr caddr;
	__u64 id;
	__be16 cport;
	__u16 svc;
	__u32 _pad;
};

enum req_state {
	REQ_PENDING = 1,  /* sent, clone in the delay line, no response yet */
	REQ_NOCLONE,      /* sent, not cloned (no free budget token, or clone failure): measured only */
	REQ_NOHEDGE,      /* clone came out due, hedge not sent (rewrite or redirect failed) */
	REQ_HEDGED,       /* hedge sent, no response yet */
	REQ_ANSWERED,     /* response arrived, clone still in the delay line */
	REQ_ANSWERED_HEDGED, /* first of two responses arrived; the second is dropped */
	REQ_REFUSED,      /* clone came out due, the window budget refused its hedge */
};

/* A scoreboard entry. state changes only by compare-and-exchange (respond() on one CPU and
 * the rescuer or another response on another must not both pass as the first). */
struct hreq {
	__u64 sent_ns;
	__u64 deadline_ns;
	__u64 hedged_ns;     /* the last hedge left */
	__u32 state;         /* enum req_state */
	__u8 orig_replica;   /* replica the client addressed (REPLICA_NONE for a VIP) */
	__u8 hedge_replica;  /* the last hedge's replica */
	__u8 hedges_sent;
	__u8 tried;          /* bit i: a copy went to replica i (the original's bit included) */
	__u32 late_responses; /* responses after the first; the entry goes when all copies answered */
	__u32 _pad;
};

/* A stored request: one cell of a service's store ring (bpf/hedge/store.h). Its lap is kept
 * apart, in the dense map store_laps (struct store_lap): the splitter reads the lap of the
 * cell it claims before anything else, and 48-byte entries stay in cache where 2 KiB cells,
 * cycled through, do not. */
struct hstore {
	__u64 deadline_ns;
	__u64 sent_ns;       /* the request's send time (a request moved to the scoreboard keeps it) */
	__u64 delay_ns;      /* this hedge's delay (far-overdue cutoff, re-queue) */
	struct hreq_key key;
	__u16 len;           /* bytes in data: IP header, UDP header, payload */
	__u8 l3_len;         /* 20 (IPv4) or 40 (IPv6) */
	__u8 ipv6;
	__u8 orig_replica;   /* replica the client addressed (the scoreboard entry's, when moved) */
	__u8 _pad[3];
	__u8 data[STORE_BYTES + 64]; /* + 64: room for the checksum's 512-byte chunks (store.h) */
};

/* What a store cell's request is, in the low LAP_STATE_BITS of its lap word (struct
 * store_lap): the word is (position / STORE_RING) << LAP_STATE_BITS | state, so that one
 * compare-and-exchange on it changes the state only for the lap it was read at. */
enum lap_state {
	LAP_EMPTY = 0,    /* free for a splitter at this lap (a release makes the next lap's) */
	LAP_PENDING = 1,  /* stored, no response yet: the request lives in the cell only, not in
			   * the scoreboard */
	LAP_ANSWERED = 2, /* its first response came while it lived in the cell: nothing to send */
	LAP_MOVED = 3,    /* its scoreboard entry decides (the tick moved it there when it came
			   * due, or it is a re-queued further hedge) */
	LAP_STATE_BITS = 2,
	LAP_STATE_MASK = 3,
};

/* A cell's lap word and whose request it holds (store_laps, the cell's index). lap is the
 * ring's protocol and the request's state (enum lap_state): the consumer's release makes it
 * the next lap's LAP_EMPTY. sent_ns and key repeat the cell's, written before the lap is
 * published: a response finds its request among the ring's cells from these lines alone,
 * without reading the cells (written on the other CPU at saturation). */
struct store_lap {
	__u64 lap;
	__u64 sent_ns;
	struct hreq_key key;
};

/* Per-service counters (per-CPU array, SVC_MAX slots; slot SVC_MAX holds the counters
 * that belong to no service, such as malformed packets). Names match kedge hedge stats.
 * Budget tokens (svc_state.tokens_milli): the splitter takes one for each clone it sends
 * into the delay line; a clone dropped without a hedge (answered, orphaned, failed) gives
 * it back; a hedge keeps it. So clones in the delay line <= tokens, and hedges <= tokens. */
struct hedge_stats {
	__u64 requests;          /* requests seen by the splitter */
	__u64 short_requests;    /* request shorter than the request-id field: passed */
	__u64 short_responses;   /* response from a service/replica address shorter than the
				  * request-id field: passed untouched, request stays open */
	__u64 fragments;         /* fragmented requests (global slot): passed untouched */
	__u64 malformed;         /* egress packets failing parse.h (global slot): passed */
	__u64 malformed_responses; /* ingress packets failing parse.h (global slot: no service
				    * can be told without ports): passed untouched */
	__u64 clones;            /* clones sent into the delay line (each holds a budget token) */
	__u64 clone_errors;      /* bpf_clone_redirect failed (token given back) */
	__u64 scoreboard_errors; /* scoreboard update failed (request passes, not hedged) */
	__u64 responses;         /* first responses */
	__u64 clones_answered;   /* clone dropped at the delay-line exit: already answered */
	__u64 clones_orphaned;   /* clone dropped: no scoreboard entry (evicted or expired) */
	__u64 recirculations;    /* clone sent round the delay line again (not due yet) */
	__u64 hedges_sent;
	__u64 hedges_won;        /* the hedge's response arrived first */
	__u64 duplicates_dropped; /* later response of a hedged request, dropped */
	__u64 budget_exhausted;  /* request never hedged for lack of budget: not cloned (bucket:
				  * no free token) or its due clone refused (window) */
	__u64 unhedged_late;     /* first response, after its deadline, of a request refused by
				  * the budget (or not cloned: a clone error): a stall the budget
				  * did not let kedge rescue */
	__u64 responses_rewritten; /* response source rewritten to the address the client used */
	__u64 hedge_rewrite_errors;    /* hedge's destination rewrite failed: hedge not sent */
	__u64 response_rewrite_errors; /* response's source rewrite failed: passed as it came */
	__u64 redirect_errors;   /* bpf_redirect_neigh (hedge) or bpf_redirect (clone sent
				  * round again) returned an error: packet dropped */
	__u64 gc_expired;        /* scoreboard entries removed by the timer (TTL) */
	__u64 rescue_unmatched;  /* packet at the delay-line exit that is no clone of a hedged
				  * service's request (global slot): dropped */
	__u64 no_replica;        /* hedge due but every replica already has the request: not sent */
	/* The stored path (bpf/hedge/store.h). */
	__u64 stored;            /* requests stored for a hedge from a pacer tick (not cloned) */
	__u64 store_too_large;   /* payload above store_limit: cloned instead */
	__u64 store_full;        /* the service's store ring was full: cloned instead */
	__u64 store_unsupported; /* IPv4 options, IPv6 extension headers or an in-band VLAN tag:
				  * cloned instead (a stored hedge is rebuilt without them) */
	__u64 pacer_ticks;       /* pacer ticks the rescuer got (global slot) */
	__u64 tick_hedges;       /* hedges sent from ticks (hedges per tick = tick_hedges / pacer_ticks) */
	__u64 overdue_dropped;   /* stored request (its tick) or clone (out of the delay line)
				  * due long ago (deadline + max(delay, 4 pacer passes, 50 ms)):
				  * not hedged that late */
	__u64 stored_answered;   /* stored request popped after its response: nothing sent */
	__u64 stored_orphaned;   /* stored request popped without its scoreboard entry (evicted,
				  * expired, or replaced by a newer request with its key) */
	__u64 hedge_build_errors; /* rebuilding a stored request into the tick failed: not sent */
	__u64 requeued;          /* hedged request queued again for a further hedge (max_hedges):
				  * its cell re-queued, or its clone carried again */
	__u64 requeue_full;      /* ... but its store ring was full (the clone into the delay
				  * line failed): no further hedge */
	__u64 tick_more;         /* tick ended with due requests left (TICK_HEDGES_MAX): the next
				  * tick is asked for at once (global slot) */
	__u64 hedges_reinjected; /* hedges of a tick but its last, cloned back into the pacer
				  * veth to leave by bpf_redirect_neigh (global slot) */
	__u64 tick_send_errors;  /* a tick's hedge could not be cloned back in or redirected:
				  * lost (global slot) */
	__u64 not_hedgeable;     /* requests the service's hedgeable rule does not match:
				  * passed unrecorded, never hedged (their responses pass too) */
	__u64 unmatched_responses; /* responses from a service or replica address matching no
				    * recorded request (not hedgeable, expired, answered and gone,
				    * or a wrong request-id spec): passed untouched */
	__u64 replicas_out;      /* hedges due but not sent: every replica without a copy of
				  * the request is ejected (hedging to them paused) */
	__u64 stored_parked;     /* pending stored requests moved off the head of a deep store
				  * ring into the service's park ring (store.h, store_park), so the
				  * answered cells behind them could go */
};


#endif /* KEDGE_HEDGE_H */
