/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* pping.h - the kernel/user contract of kedge's passive RTT monitor (kedge pping).
 *
 * Data flow (docs/pping.md has the details):
 *   TC egress  (pping_egress)  and  TC ingress (pping_ingress) or XDP (pping_xdp), one
 *   object, one interface:
 *     every packet with an identifier is both a possible request (its identifier is
 *     timestamped in pkt_ts, keyed by its own direction) and a possible reply (its echo is
 *     looked up under the reverse direction). A match gives an RTT, which goes to the
 *     'events' ring buffer (per-sample mode) or into the per-subnet histograms (-a mode).
 *   flows      : per-flow state for both directions under one canonical key (rate limit,
 *                last identifier, min/smoothed RTT, open/close state, spin state).
 *   garbage collection: user space reads the maps every cleanup interval
 *                (internal/pping/gc.go) and hands what expired to pping_gc_expire
 *                (identifiers) and pping_gc_flows (flows), which it runs with
 *                BPF_PROG_TEST_RUN: they delete in the kernel and keep the outstanding
 *                counts and the hint slots right.
 *
 * RTT sources (request -> reply; the source names the kind of sample in the output):
 *   tsval   TCP: TSval of a segment that carries data (or a SYN) ->  TSecr of an ACK
 *   icmp    echo request sequence (flow port = echo id)           ->  echo reply sequence
 *           (ICMPv6 the same with types 128/129)
 *   dns     query (QR=0) to UDP port 53: transaction id           ->  response (QR=1) from 53
 *   udp     request to a configured service port: reqid.h id      ->  response from that port
 *   quic    QUIC short header to/from a configured port: a spin-bit edge in one direction
 *           -> the edge it causes in the other (RFC 9000 section 17.4)
 *   kernel  the RTT the kernel's TCP stack measures for a socket of this host (sock_ops
 *           program pping_sockops, BPF_SOCK_OPS_RTT_CB, on the configured cgroup)
 *
 * Go mirrors these structs through bpf2go (-type); every struct has explicit padding so its
 * layout is the same on both sides and no uninitialised byte reaches a map key or user space.
 */
#ifndef KEDGE_PPING_H
#define KEDGE_PPING_H

#include "vmlinux.h"
#include "parse.h"
#include "reqid.h"

/* The constants are enum members so that they reach the object's BTF: internal/pping
 * generates its Go constants from them (bpf2go -type pp_consts) or a test compares them. */
enum pp_consts {
	/* Map sizes. Hash maps are preallocated (no allocation on the packet path), so these
	 * are also the memory budget: about 100 B per pkt_ts entry and 230 B per flow. User
	 * space may lower or raise them before loading (--max-flows); these are the defaults. */

	/* Concurrent flows (both directions share one entry). 2^16 covers the flow count of a
	 * busy edge link; beyond it new flows are counted as flow_map_full, existing ones keep
	 * working. */
	PP_MAX_FLOWS = 65536,
	/* Outstanding (unmatched) identifiers. A flow stores at most one per rate-limit
	 * interval (100 ms by default) and a match deletes it, so a healthy flow holds 1-2 and
	 * the map needs about two per flow; the garbage collector removes the ones never
	 * answered. */
	PP_MAX_PKT_TS = 2 * PP_MAX_FLOWS,
	/* UDP services measured through reqid.h (the same description as kedge hedge's). */
	PP_MAX_SERVICES = 64,
	/* Subnets per aggregation buffer, per address family. Not preallocated: memory follows
	 * the number of subnets actually seen; a subnet that does not fit is counted
	 * (agg_map_full) and folded into the "other" entry (PP_AGG_OTHER_*), which user space
	 * creates up front. */
	PP_MAX_SUBNETS = 4096,
	/* Event ring buffer: 1 MiB holds ~8000 RTT events, ~80 ms of a 100k samples/s burst
	 * while user space is descheduled. A full ring is counted (event_dropped), never
	 * silent. */
	PP_RINGBUF_BYTES = 1 << 20,

	/* Fixed point for rtt_rate: value << 16 (so 0.5 RTT is 32768). */
	PP_FIXPOINT_SHIFT = 16,

	/* Hints: per hash slot of request directions (maps.h's pp_hint), the count of their
	 * outstanding identifiers and of those still waiting to be opened by a reply, so that
	 * a pure reply (an ACK, a DNS response...) whose request direction has nothing of
	 * either is recognised without a flow lookup. 4096 x 4 bytes stay in cache; a
	 * collision only sends a reply the slow way. */
	PP_HINT_BITS = 12,
	PP_HINT_SLOTS = 1 << PP_HINT_BITS,
	/* Identifiers the garbage collector expires per BPF_PROG_TEST_RUN of pping_gc_expire
	 * (their pkt_ts keys make the run's packet: 64 x 48 bytes fit a page), and flows per
	 * run of pping_gc_flows (its return value is a bit per flow). */
	PP_GC_BATCH = 64,
	PP_GC_FLOW_BATCH = 32,

	/* TSvals a TCP direction remembers of those it has outstanding, oldest first, so that
	 * an echo can retire the older ones (flow.h's pp_retire()). One is stored per
	 * rate-limit interval, so a direction has about RTT / interval + 1 outstanding that
	 * may still be echoed: 4 cover an RTT of three intervals (300 ms at the default
	 * 100 ms); a TSval that does not fit is left to the garbage collector. A power of
	 * two (the index is masked). */
	PP_TS_QUEUE = 4,

	/* QUIC: UDP ports whose traffic is QUIC (a packet to or from one of them), and the
	 * connection id bytes kept (RFC 9000 allows 20; the first 8 name the flow). */
	PP_MAX_QUIC_PORTS = 8,
	PP_QUIC_CID_MAX = 20,
	PP_QUIC_ID_BYTES = 8,

	/* RTT histogram (aggregation mode): hist.h's log-linear layout over the RTT in
	 * nanoseconds, PP_HIST_SUB (8) buckets per power of two: below 2^PP_HIST_MIN_SHIFT ns
	 * (256 ns) 8 linear buckets of 32 ns, then 8 per octave up to 2^PP_HIST_MAX_SHIFT ns
	 * (68.7 s); the last bucket holds the rest. A bucket is at most 12.5 % of its lower
	 * edge wide (2 us at 20 us, 1 ms at 10 ms), where ePPing's linear bins are 4 ms. Go:
	 * internal/hist with the same layout. */
	PP_HIST_SUB_BITS = 3,
	PP_HIST_SUB = 1 << PP_HIST_SUB_BITS,
	PP_HIST_MIN_SHIFT = 8,
	PP_HIST_MAX_SHIFT = 36,
	PP_HIST_BINS = ((PP_HIST_MAX_SHIFT - PP_HIST_MIN_SHIFT + 1) << PP_HIST_SUB_BITS) + 1,
};

/* Aggregation keys for the "other" entry: prefixes no reply can come from.
 * IPv4 255.255.255.255 (limited broadcast) and IPv6 ffff:ffff:ffff:ffff::/64 (multicast).
 * Keys hold the masked address in network byte order, so all-ones needs no byte swap.
 * #defines: the IPv6 key is 64 bits wide, beyond what an enum carries to every kernel's
 * BTF. */
#define PP_AGG_OTHER_V4 0xffffffffU
#define PP_AGG_OTHER_V6 0xffffffffffffffffULL

enum pp_event_type {
	PP_EVENT_RTT = 1,
	PP_EVENT_FLOW = 2,
	PP_EVENT_MAP_FULL = 3,
};

/* Which identifier a flow is measured with. */
enum pp_id_type {
	PP_ID_NONE = 0,
	PP_ID_TCP_TS = 1,
	PP_ID_ICMP_ECHO = 2,
	PP_ID_DNS = 3,
	PP_ID_UDP_REQID = 4,
	PP_ID_QUIC_SPIN = 5, /* QUIC spin bit; id = the server's connection id (first 8 bytes) */
	PP_ID_KERNEL = 6,    /* the kernel's RTT of a local TCP socket (events only) */
};

/* Which side of the monitored interface an aggregation entry's subnet is on, seen from the
 * packet: a packet arriving (ingress) comes from the remote side and goes to the local one,
 * a packet leaving (egress) the other way round. */
enum pp_agg_side {
	PP_SIDE_REMOTE = 0,
	PP_SIDE_LOCAL = 1,
};

enum pp_conn_state {
	PP_CONN_EMPTY = 0,    /* direction not seen yet */
	PP_CONN_WAITOPEN = 1, /* seen, no reply yet */
	PP_CONN_OPEN = 2,     /* the other direction answered */
	PP_CONN_CLOSED = 3,   /* FIN/RST seen */
};

enum pp_flow_event_type {
	PP_FLOW_OPENING = 1,
	PP_FLOW_CLOSING = 2,
};

enum pp_flow_reason {
	PP_REASON_NONE = 0,
	PP_REASON_SYN = 1,
	PP_REASON_SYN_ACK = 2,
	PP_REASON_FIRST_PKT = 3, /* first packet observed (SYN skipped, or mid-flow start) */
	PP_REASON_FIN = 4,
	PP_REASON_RST = 5,
	PP_REASON_TIMEOUT = 6,
};

enum pp_flow_source {
	PP_SOURCE_PKT_SRC = 0,  /* the packet's sender triggered it */
	PP_SOURCE_PKT_DEST = 1, /* the packet's receiver (a reply) triggered it */
	PP_SOURCE_GC = 2,       /* garbage collection */
};

enum pp_map_id {
	PP_MAP_FLOWS = 0,
	PP_MAP_PKT_TS = 1,
	PP_MAP_AGG = 2,
	PP_MAP_NR = 3,
};

/* Counter slots in the per-CPU 'counters' array. The XDP ingress program (pping_xdp, the
 * alternative to pping_ingress) counts in the ingress slot; the sock_ops program in its own;
 * the garbage collector's programs (pping_gc_expire, pping_gc_flows) in PP_HOOK_GC. */
enum pp_hook {
	PP_HOOK_INGRESS = 0,
	PP_HOOK_EGRESS = 1,
	PP_HOOK_SOCKOPS = 2,
	PP_HOOK_GC = 3,
	PP_HOOK_NR = 4,
};

/* One direction of a flow. Addresses as in parse.h (IPv4 v4-mapped), ports in network
 * order; ICMP echo flows carry the echo identifier in both ports. */
struct pp_tuple {
	struct in6_addr saddr;
	struct in6_addr daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;   /* IPPROTO_TCP, IPPROTO_UDP, IPPROTO_ICMP, IPPROTO_ICMPV6 */
	__u8 ipv;     /* 4 or 6 */
	__u8 id_type; /* enum pp_id_type; the same in both directions of a flow */
	__u8 _pad;
};

/* pkt_ts key: the direction a request travelled in, and its identifier. */
struct pp_pkt_id {
	struct pp_tuple flow;
	__u64 id; /* TSval, echo sequence, DNS id or request id (host order) */
};

/* State of one direction (the packets from one endpoint to the other), in two parts kept on
 * separate cache lines: ingress and egress usually run on different CPUs, and each packet
 * writes its own direction's bookkeeping but only reads the reverse direction's state
 * (whether it is open, whether it has identifiers outstanding). With both parts on one line,
 * every ACK at egress pulled the line that the last data packet at ingress had written
 * (about 100 ns per packet on the development VM).
 *
 * pp_dir_shared: read by the packets of both directions, written rarely: when the direction
 * opens or closes, when it stores an identifier or a spin edge, when a sample is taken. */
struct pp_dir_shared {
	__u64 min_rtt;   /* ns; 0 until the first sample */
	__u64 srtt;      /* ns; 7/8 old + 1/8 new, as TCP */
	__u64 last_ts;   /* ns of the last timestamp attempt (rate limit, identifier lifetime) */
	__u64 last_ts_j; /* the same in jiffies: the rate limit's cheap first test */
	__u64 edge_time; /* QUIC: ns of the spin edge waiting for its echo (edge_pending) */
	__u64 last_edge; /* QUIC: ns of the last edge accepted in this direction */
	__u32 outstanding; /* stored, not yet matched or expired, identifiers */
	__u8 conn;         /* enum pp_conn_state */
	__u8 open_reason;  /* enum pp_flow_reason */
	__u8 has_ts;       /* a timestamp was attempted at least once */
	__u8 local;        /* destination is this host and local flows are excluded */
	__u8 ns_seen;      /* keep own.last_seen_ns: the reverse direction times pure ACKs */
	__u8 spin;         /* QUIC: the spin value of this direction's last accepted packet */
	__u8 spin_state;   /* QUIC: enum pp_spin_state */
	__u8 edge_pending; /* QUIC: edge_time holds an edge waiting for its echo */
	__u8 cid_len;      /* QUIC: length of this direction's destination connection id */
	__u8 cid_known;    /* QUIC: cid_len was learnt from a long header of the reverse direction */
	__u8 q_head;       /* TCP: ts_queue's first entry and one past its last, counting */
	__u8 q_tail;       /* modulo 256 (entry i is ts_queue[i % PP_TS_QUEUE]) */
	/* TCP: TSvals stored (in pkt_ts) in this direction, in the order stored, which is
	 * serial order (pp_id_is_new()): an echo of one retires those before it
	 * (pp_retire()). A hint of which keys to try, never trusted alone: an entry is
	 * retired only by deleting its pkt_ts key, and a stale one (matched, expired) is
	 * skipped when an echo passes it. */
	__u32 ts_queue[PP_TS_QUEUE];
};

enum pp_spin_state {
	PP_SPIN_UNKNOWN = 0, /* no short header seen yet */
	PP_SPIN_SEEN = 1,    /* seen, not flipped yet (a disabled spin bit stays here) */
	PP_SPIN_FLIPPED = 2, /* flipped at least once */
};

/* pp_dir_own: written by every packet of the direction, read by the other direction's
 * packets only when they produce a sample. */
struct pp_dir_own {
	__u64 last_seen;    /* jiffies of the last packet (idle expiry) */
	__u64 last_seen_ns; /* ns of the last packet, kept only while shared.ns_seen */
	__u64 pkts;         /* packets / payload bytes in this direction */
	__u64 bytes;
	__u64 last_id;      /* TCP: last TSval seen (new-identifier check); QUIC: destination
			     * connection id (first 8 bytes, big-endian) */
	__u64 last_id_time; /* ns: when a pure ACK this host sent last carried last_id */
};

/* pkt_ts value: the time the identifier was stored (ns), bit 0 replaced by PP_TS_PURE_ACK
 * when it came from a pure ACK (1 ns of resolution for one bit of provenance). */
#define PP_TS_PURE_ACK 1ULL

/* flows value. Index 0 is the direction whose source is the canonical key's saddr:sport
 * (the lower endpoint, see pp_src_sorts_first()), index 1 the other one. The gaps keep
 * each own part 64 bytes away from everything another CPU touches per packet (map values
 * are only 8-byte aligned, so distance is what can be guaranteed, not alignment). lock
 * serialises the moves of the directions' conn (flow.h's pp_conn_move()), which change the
 * hint slots: taken only for those moves, it sits in the first gap. */
struct pp_flow_state {
	struct pp_dir_shared shared[2];
	struct bpf_spin_lock lock;
	__u8 _gap0[60];
	struct pp_dir_own own0;
	__u8 _gap1[80];
	struct pp_dir_own own1;
};

/* An RTT sample. flow is the reply's direction (src = the far end whose RTT this is), as
 * ePPing and Kathie Nichols' pping report it; the counters are those of the request
 * direction. */
struct pp_rtt_event {
	__u64 type;      /* PP_EVENT_RTT */
	__u64 timestamp; /* CLOCK_MONOTONIC ns of the reply */
	struct pp_tuple flow;
	__u64 rtt;
	__u64 min_rtt;
	__u64 srtt;
	__u64 sent_pkts;
	__u64 sent_bytes;
	__u64 rec_pkts;
	__u64 rec_bytes;
	__u64 id;
	__u8 match_on_egress; /* the reply left through egress (a local flow, -l) */
	__u8 id_len;          /* QUIC: connection id bytes in id (0-8); 0 otherwise */
	__u8 _pad[6];
};

/* A flow opening or closing. flow is given reply-side first, like RTT events. */
struct pp_flow_event {
	__u64 type; /* PP_EVENT_FLOW */
	__u64 timestamp;
	struct pp_tuple flow;
	__u8 event;  /* enum pp_flow_event_type */
	__u8 reason; /* enum pp_flow_reason */
	__u8 source; /* enum pp_flow_source */
	__u8 _pad[5];
};

/* A map was full (at most one per map per second; the counters have every occurrence). */
struct pp_map_full_event {
	__u64 type; /* PP_EVENT_MAP_FULL */
	__u64 timestamp;
	struct pp_tuple flow;
	__u8 map; /* enum pp_map_id */
	__u8 _pad[7];
};

/* Read-only configuration, set by user space before loading (const volatile). */
struct pp_config {
	__u64 rate_limit_ns;        /* min gap between timestamps of one direction; 0: none */
	__u64 rtt_rate;             /* if > 0: rate limit = rtt_rate * RTT (fixed point) */
	__u64 ts_min_lifetime_ns;   /* unmatched identifier: expires after clamp(8 srtt, min, max) */
	__u64 ts_max_lifetime_ns;
	__u64 flow_lifetime_ns;     /* idle TCP direction */
	__u64 dgram_lifetime_ns;    /* idle ICMP/UDP direction */
	__u64 unopened_lifetime_ns; /* direction never answered */
	__u64 v6_prefix_mask;       /* aggregation: first 64 bits, network order */
	__u64 jiffy_ns;             /* the kernel's tick (user space measures it); 0: unknown,
				     * every rate-limit test reads the ns clock */
	__u32 v4_prefix_mask;       /* aggregation: network order */
	__u16 quic_ports[PP_MAX_QUIC_PORTS]; /* network order; 0 ends the list */
	__u8 track_tcp;
	__u8 track_icmp;
	__u8 track_dns;
	__u8 track_udp;      /* services in the 'services' map */
	__u8 localfilt;      /* skip flows to this host seen at ingress (ePPing default) */
	__u8 skip_syn;       /* ignore SYNs: flows start at their first data packet */
	__u8 use_srtt;       /* rtt_rate applies to srtt instead of min RTT */
	__u8 push_events;    /* per-sample RTT and flow events to the ring buffer */
	__u8 aggregate;      /* per-subnet histograms */
	__u8 agg_by_dst;     /* aggregate by the reply's destination instead of its source */
	__u8 debug;          /* bpf_printk traces */
	__u8 host_acks;      /* pure ACKs this host sends are requests too (an endpoint's own flows) */
	__u8 track_quic;     /* QUIC spin bit on quic_ports */
	__u8 track_kernel;   /* sock_ops: the kernel's RTTs of this namespace's TCP sockets */
	__u8 no_fast_path;   /* tests: every packet through parse_pkt() (ident.h's pp_fast_tcp) */
	__u8 _pad[1];
};

/* Per-CPU counters, one slot per enum pp_hook. Every packet is counted once in pkts and,
 * if it is not measured, under exactly one skip reason; the ts_* and match_* groups count
 * what happened to its identifier and its echo. */
struct pp_counters {
	/* What nearly every packet of a busy flow touches, first: these share the value's
	 * first cache line, so a packet that produces nothing updates one line. */
	__u64 pkts;
	__u64 bytes;
	__u64 ts_not_new;      /* same or older identifier (TCP: TSval not advanced) */
	__u64 ts_rate_limited;
	__u64 match_none;      /* nothing outstanding in the reverse direction (or a reply of a
				* flow the monitor does not know) */
	__u64 match_miss;      /* outstanding identifiers, but not this one */
	__u64 ts_stored;
	__u64 match_rtt;       /* RTT sample taken */
	__u64 parse_err[PARSE_ERR_MAX]; /* index: -enum parse_err */
	/* not measurable */
	__u64 skip_proto;     /* no identifier for this protocol/port (or tracking it is off) */
	__u64 skip_no_tcp_ts; /* TCP without the timestamp option */
	__u64 skip_syn;       /* SYN while SYNs are skipped */
	__u64 skip_icmp_type; /* ICMP other than echo request/reply */
	__u64 skip_udp_short; /* DNS header or request id beyond the datagram */
	__u64 skip_no_flow;   /* no flow state, and a closing packet cannot start one */
	/* flow table */
	__u64 flow_created;
	__u64 flow_map_full;
	__u64 flow_opened;
	__u64 flow_closed;
	__u64 flow_deleted;
	/* identifiers of this packet (request side; ts_stored, ts_not_new, ts_rate_limited
	 * above) */
	__u64 ts_inactive;     /* the direction is closed */
	__u64 ts_local;        /* flow to this host, local flows excluded */
	__u64 ts_exists;       /* an identical identifier is still outstanding */
	__u64 ts_map_full;
	__u64 ts_retrans;      /* UDP/ICMP identifier sent again: sample discarded (Karn) */
	__u64 ts_retired;      /* TCP identifiers deleted because an echo of a later TSval of
				* their direction arrived, so none will echo them (RFC 7323:
				* TS.Recent does not go back); counted at the echo's hook */
	/* echoes in this packet (reply side; match_rtt, match_none, match_miss above) */
	__u64 match_clock;     /* stored time after now (clock went backwards) */
	__u64 match_ack_idle;  /* echo of a pure ACK, but nothing came from the far end in between:
				* it may have been idle, so the sample is discarded */
	/* QUIC (spin bit) */
	__u64 quic_long;          /* long header: connection ids learnt, no spin bit */
	__u64 quic_short;         /* short header */
	__u64 quic_spin_idle;     /* short header of a direction whose spin bit has not flipped
				   * yet (every one, when the endpoints disable the spin bit) */
	__u64 quic_edge;          /* spin edge accepted */
	__u64 quic_edge_rejected; /* spin flip that the reverse direction does not explain, or
				   * that came sooner after the last edge than half the flow's
				   * min RTT (a reordered packet): ignored */
	__u64 quic_cid_changed;   /* new destination connection id: spin state restarted */
	/* sock_ops (slot PP_HOOK_SOCKOPS); samples count as match_rtt, rate-limited ones as
	 * ts_rate_limited */
	__u64 sk_tracked;       /* established TCP socket of the monitored namespace: RTT
				 * callbacks switched on */
	__u64 sk_other_netns;   /* established TCP socket of another namespace: left alone */
	__u64 sk_storage_fail;  /* no socket storage for its rate limit: sample dropped */
	/* output */
	__u64 event_dropped;   /* ring buffer full */
	__u64 agg_map_full;    /* subnet folded into "other" */
	/* garbage collection (slot PP_HOOK_GC): what pping_gc_expire and pping_gc_flows, run
	 * by the collector (internal/pping/gc.go), deleted */
	__u64 gc_ts_expired;
	__u64 gc_flow_expired;
};

/* Traffic of one subnet in one direction (ePPing's struct traffic_counters): TCP segments
 * with the timestamp option that the monitor could measure, other TCP, and every other
 * packet that parsed as IP. Bytes are whole frames (the Ethernet header included). */
struct pp_traffic {
	__u64 tcp_ts_pkts;
	__u64 tcp_ts_bytes;
	__u64 tcp_nots_pkts;
	__u64 tcp_nots_bytes;
	__u64 other_pkts;
	__u64 other_bytes;
};

/* Aggregation keys: a subnet (the address masked to the configured prefix, network order)
 * and the side of the interface it is on (enum pp_agg_side). */
struct pp_agg_key4 {
	__u32 prefix;
	__u8 side;
	__u8 _pad[3];
};

struct pp_agg_key6 {
	__u64 prefix; /* the first 64 bits */
	__u8 side;
	__u8 _pad[7];
};

/* Per-subnet aggregation value (per-CPU hash; user space sums the CPUs). Every IP packet is
 * counted twice: under its remote endpoint's subnet (side remote) and under its local one's
 * (side local); rx if it arrived on the interface (ingress), tx if it left (egress). So the
 * two directions of a flow stay apart even when both ends are in one subnet. RTT samples go
 * to the subnet of the reply's source (--aggregate-reverse: destination), on the side the
 * reply came from. */
struct pp_agg_stats {
	struct pp_traffic rx;
	struct pp_traffic tx;
	__u64 count;
	__u64 sum_ns;
	__u64 min_ns;
	__u64 max_ns;
	__u32 bins[PP_HIST_BINS];
};

#endif /* KEDGE_PPING_H */
