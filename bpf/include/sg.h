/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* sg.h - the wire format and kernel/user contract of kedge's scatter-gather (kedge sg).
 *
 * Data flow (docs/sg.md and docs/architecture.md have the picture):
 *   coordinator iface egress  (sg_scatter)  : the application's ONE request datagram is
 *       cloned to every worker of its group (destination address, port, MAC, worker index
 *       and checksums rewritten per copy); its slot is armed; the original is dropped
 *   coordinator iface ingress (sg_gather)   : a worker's reply is checked (group, registered
 *       worker address and port, full request id, duplicate bit), reduced into the slot's
 *       aggregate and dropped; the reply that completes the request emits the result
 *       into the ring buffer (with SG_GF_WAKE_SOCKET it is then passed to the
 *       coordinator socket as the reader's wake-up instead of dropped)
 *   expiry (bpf_timer per slot, or sg_sweep): a request not complete by its deadline
 *       completes with status SG_ST_TIMEOUT, the partial aggregate and the bitmap
 * Go mirrors these structs through bpf2go (-type); padding is explicit. The constants are
 * enum members so that they reach the object's BTF: internal/sg's wire codec is written by
 * hand, and TestWireMatchesBTF compares its constants and header offsets with them.
 *
 * Wire format (all fields big-endian, 32 bytes, directly after the UDP header):
 *
 *    0      magic        0x6b53 ("kS")
 *    2      version      SG_VERSION
 *    3      op           SG_OP_REQUEST | SG_OP_REPLY
 *    4      group        group id (the coordinator's; workers echo it)
 *    6      worker       worker index: written per copy by the scatter; replies echo it
 *    8      req_id       64-bit request id (workers echo it)
 *   16      status       reply: 0 = ok, else a worker error (counted, not aggregated)
 *   18      need         request: replies that complete it (0 = all workers); reply: 0
 *   20      part         reply: index of this part, 0..nparts-1 (request: 0)
 *   22      nparts       reply: number of parts, 0 or 1 = a single packet, at most
 *                        SG_PARTS_MAX (request: 0)
 *   24      timeout_us   request: deadline in microseconds (0 = the group's); reply: 0
 *   28      payload_len  bytes of payload that follow the header
 *   32      payload      request: opaque to kedge; reply: the worker's value (see below)
 *
 * Reply payload per reduction: SUM/MIN/MAX - a vector of `elems` int32 or int64 (per the
 * group's dtype), big-endian, payload_len == elems * size; COUNT - anything; GATHER -
 * exactly `elems * size` opaque bytes, copied into the result in arrival order.
 *
 * Multi-packet replies (nparts > 1; groups with SG_GF_PARTS, not GATHER): part p of a
 * worker's reply carries the elements [p * k, min((p + 1) * k, elems)) of its vector, where
 * k = ceil(elems / nparts); every part must be non-empty ((nparts - 1) * k < elems) and its
 * payload_len exactly its slice's bytes. COUNT: any payload per part. Each part is reduced
 * into the aggregate as it arrives; the worker has answered (bitmap, count, completion)
 * when all nparts parts have. Which parts arrived is kept per (slot, worker) in the parts
 * map (struct sg_parts), touched only by replies with nparts > 1. */
#ifndef KEDGE_SG_H
#define KEDGE_SG_H

#include "vmlinux.h"

enum sg_wire {
	SG_MAGIC = 0x6b53,
	SG_VERSION = 1,
	SG_HDR_LEN = 32, /* sizeof(struct sg_hdr) */
};

enum sg_op {
	SG_OP_REQUEST = 1,
	SG_OP_REPLY = 2,
};

struct sg_hdr {
	__be16 magic;
	__u8 version;
	__u8 op;
	__be16 group;
	__be16 worker;
	__be64 req_id;
	__be16 status;
	__be16 need;
	__be16 part;
	__be16 nparts;
	__be32 timeout_us;
	__be32 payload_len;
};

enum sg_limits {
	/* Groups per loaded instance (the groups map). kedge's Go API opens one group per
	 * instance; the map keeps room for more behind one XDP program per interface. */
	SG_GROUPS_MAX = 16,
	/* Workers per group: 1024 (the "at least 1024"); the bitmap has one bit each. */
	SG_WORKERS_MAX = 1024,
	SG_BITMAP_WORDS = SG_WORKERS_MAX / 64,
	/* Request slots per instance, shared by its groups (each group owns a range). This is
	 * the in-flight ceiling: 1024 slots of ~2.3 KiB each = 2.4 MiB of locked map memory.
	 * The slot of a request is req_id & SG_SLOT_MASK; the full id is stored and checked. */
	SG_SLOTS = 1024,
	SG_SLOT_MASK = SG_SLOTS - 1,
	/* Aggregate bytes per slot: 256 int64 accumulators (int32 vectors are summed in int64
	 * so a sum of 1024 int32 cannot wrap); GATHER concatenates up to this many payload
	 * bytes. */
	SG_AGG_BYTES = 2048,
	SG_AGG_ELEMS = SG_AGG_BYTES / 8,
	SG_AGG_WORDS = SG_AGG_BYTES / 4,
	/* GATHER keeps the arrival order of at most this many replies. */
	SG_GATHER_MAX = 64,
	/* Parts of a multi-packet reply (one bit each in struct sg_parts). The vector they
	 * carry together is still at most SG_AGG_ELEMS elements. */
	SG_PARTS_MAX = 32,
	/* Replicas of one shard (a worker slot of a group with SG_GF_REPLICAS): the processes
	 * that can answer for it. A power of two, so an index is bounded with a mask. */
	SG_REPLICAS_MAX = 4,
	/* A replica's back-off doubles with each ejection in a row up to this many times. */
	SG_EJECT_LEVEL_MAX = 16,
	/* Re-sends (SG_GF_RESEND): a request frame (Ethernet to the end of the payload) is
	 * stored for them when it is at most this long; a longer one is scattered but never
	 * re-sent (counted resend_unstored). One Ethernet MTU's frame. */
	SG_STORE_BYTES = 1536,
	SG_CSUM_CHUNK = 512, /* bpf_csum_diff's largest size */
	/* struct sg_stored.rep_first/rep_last: 2 bits (a replica index < SG_REPLICAS_MAX) per
	 * worker. */
	SG_REP_WORDS = SG_WORKERS_MAX * 2 / 64,
	/* A re-sent copy's cost in the budget's milli-copies (struct sg_budget). */
	SG_COPY_MILLI = 1000,
};

enum sg_reduce {
	SG_RED_SUM = 0,
	SG_RED_MIN = 1,
	SG_RED_MAX = 2,
	SG_RED_COUNT = 3,
	SG_RED_GATHER = 4,
	/* A reduction the user wrote in C (sg_user.h): the gather checks the reply as for SUM
	 * (payload_len == elems * size) and tail-calls the group's program in the
	 * sg_user_progs array, which reduces it under the slot's lock. */
	SG_RED_USER = 5,
};

enum sg_dtype {
	SG_T_I32 = 0,
	SG_T_I64 = 1,
};

/* How the scatter picks a shard's replica (struct sg_group.replica_choice). */
enum sg_replica_choice {
	SG_RC_ROUND_ROBIN = 0, /* (req_id / SG_SLOTS + shard) mod nreplicas */
	SG_RC_LATENCY = 1,     /* the lowest estimated median reply time (p50_ns) */
};

enum sg_status {
	SG_ST_OK = 0,      /* completed by its policy */
	SG_ST_TIMEOUT = 1, /* deadline passed: partial aggregate and bitmap */
};

/* Group flags (struct sg_group.flags). */
enum sg_group_flags {
	/* The interface is a loopback: batches are handed on through its egress (a packet
	 * redirected to lo's ingress loses its route, and 127.0.0.0/8 without one is martian
	 * on input). */
	SG_GF_LOOPBACK = 0x1,
	/* The reply that completes a request is passed (XDP_PASS) to the coordinator socket,
	 * untouched, and its result is emitted with BPF_RB_NO_WAKEUP: the packet's arrival on
	 * the socket is the reader's wake-up (softirq -> sk_data_ready, as a user-space
	 * baseline is woken) instead of the ring buffer's irq_work. The result is committed
	 * before XDP returns, so it is in the ring when the socket wakes. Timeouts (no packet)
	 * keep the ring's wake-up. */
	SG_GF_WAKE_SOCKET = 0x2,
	/* Multi-packet replies are reduced per part (the parts map holds this group's entries
	 * at part_base); without it they are passed. */
	SG_GF_PARTS = 0x4,
	/* Worker slots are shards with replicas (the replicas map holds this group's entries
	 * at replica_base): each copy goes to one replica of its shard, round robin over the
	 * replicas not ejected, and a reply from any of them answers for the shard. */
	SG_GF_REPLICAS = 0x8,
	/* Re-sends (bpf/sg/resend.h): the request is stored at the scatter (the stored map,
	 * key slot) and a pacer tick asked for at resend_ns; a worker that has not answered by
	 * then gets its copy again, to the next replica of its shard after the one its last
	 * copy went to (a hedge) or, with no other replica, to the same worker (a retry), up
	 * to resend_max rounds, each copy paid from the group's budget. */
	SG_GF_RESEND = 0x10,
};

/* Result flags (struct sg_result.flags). */
enum sg_result_flags {
	SG_F_OVERFLOW = 0x1, /* an int64 sum wrapped */
	/* Parts of multi-packet replies were reduced; for MIN/MAX the accumulators then start
	 * at the identity (INT64_MAX / INT64_MIN), so an element no part covered holds it
	 * (docs/sg.md). */
	SG_F_PARTS = 0x2,
};

enum sg_slot_state {
	SG_SLOT_FREE = 0,
	SG_SLOT_PENDING = 1,
	SG_SLOT_DONE = 2,
};

/* groups map value: written by user space before traffic. */
struct sg_group {
	__u8 enabled;
	__u8 family;        /* 4 or 6: every worker and the coordinator share it */
	__u8 reduce;        /* enum sg_reduce */
	__u8 dtype;         /* enum sg_dtype */
	__u16 nworkers;     /* 1..SG_WORKERS_MAX */
	__u16 elems;        /* vector length (GATHER: payload bytes = elems * size) */
	__u16 slot_base;    /* this group's slots: [slot_base, slot_base + nslots) */
	__u16 nslots;
	__u16 worker_base;  /* index of worker 0 in the workers map */
	__u16 flags;        /* SG_GF_* */
	__u32 ifindex;      /* the interface copies leave through */
	__u32 gather_k;     /* GATHER: keep the first K payloads (K * payload <= SG_AGG_BYTES) */
	__u64 timeout_ns;   /* default deadline */
	struct in6_addr coord_addr; /* the coordinator socket (IPv4 as ::ffff:a.b.c.d) */
	__be16 coord_port;
	__u16 _pad1;
	__u32 part_base;    /* SG_GF_PARTS: this group's entries in the parts map start here,
			     * (slot - slot_base) * nworkers + worker after it */
	__u32 replica_base; /* SG_GF_REPLICAS: shard i's entry in the replicas map */
	__u32 replica_choice; /* enum sg_replica_choice */
	/* Replica judgement (SG_GF_REPLICAS, struct sg_shard): a replica that has left a copy
	 * unanswered for judge_ns, with no reply from it since, is ejected for eject_base_ns,
	 * doubled with each ejection in a row up to eject_max_ns. judge_ns 0: never. */
	__u64 judge_ns;
	__u64 eject_base_ns;
	__u64 eject_max_ns;
	/* SG_GF_RESEND: a round of re-sends is due resend_ns after the scatter and after each
	 * round (with SG_GF_REPLICAS and the adaptive delay, half of it after a round:
	 * resend_again_delay), up to resend_max rounds per request. The budget (struct sg_budget): each
	 * request deposits budget_ratio_milli x nworkers milli-copies while fewer than
	 * budget_cap_milli are saved; a re-sent copy takes SG_COPY_MILLI, refused when there
	 * are not that many. So re-sent copies <= ratio x copies scattered + cap / 1000. */
	__u64 resend_ns;
	__u32 resend_max;
	__u32 budget_ratio_milli;
	__u64 budget_cap_milli;
	/* resend_quantile_milli > 0: the delay is instead the group's estimated quantile (of
	 * that many thousandths) of reply times (struct sg_budget.delay_ns, stepped by every
	 * first reply of a worker that was not re-sent), clamped to [resend_min_ns,
	 * resend_ns]; resend_ns until there is an estimate. */
	__u32 resend_quantile_milli;
	__u32 _pad2;
	__u64 resend_min_ns;
};

/* workers map value (index worker_base + i). */
struct sg_worker {
	struct in6_addr addr; /* IPv4 as ::ffff:a.b.c.d */
	__be16 port;
	__u8 mac[6];          /* next hop's MAC (zero on loopback) */
};

/* replicas map value (key replica_base + worker index), groups with SG_GF_REPLICAS: the
 * replicas of one shard. User space writes nreplicas and key[] (replica r's address is the
 * workers map's entry key[r]; key[0] = worker_base + i, the others in the map's extra
 * range past SG_GROUPS_MAX * SG_WORKERS_MAX) and zeroes the rest; the data plane keeps the
 * judgement state, unlocked (racing updates from two CPUs lose a step, never a replica):
 *   scatter: the copy of a request for shard i goes to replica (req_id / SG_SLOTS + i) mod
 *            nreplicas, or the next one after it that is not ejected (all ejected: that one
 *            anyway, counted shard_out); with SG_RC_LATENCY to the replica not ejected with
 *            the lowest p50_ns (ties: the first from there). Sets unanswered_ns when it is 0.
 *            A candidate whose unanswered_ns is judge_ns old is ejected first (ejections).
 *   gather:  a reply from any replica answers for the shard (worker index i); it clears the
 *            replica's unanswered_ns and level (written only when set); with SG_RC_LATENCY
 *            it steps the replica's p50_ns. */
struct sg_shard {
	__u32 nreplicas;    /* 1..SG_REPLICAS_MAX */
	__u32 key[SG_REPLICAS_MAX];           /* replica r: its entry in the workers map */
	__u32 level[SG_REPLICAS_MAX];         /* ejections in a row */
	__u32 _pad;
	__u64 unanswered_ns[SG_REPLICAS_MAX]; /* first copy sent since its last reply (0: none) */
	__u64 out_until_ns[SG_REPLICAS_MAX];  /* ejected until then */
	/* SG_RC_LATENCY: each replica's estimated median reply time (0: none yet), stepped by
	 * every single-packet reply from it that finds its request in the slot. */
	__u64 p50_ns[SG_REPLICAS_MAX];
};

/* stored map value, key slot (groups with SG_GF_RESEND; user space sizes the map SG_SLOTS
 * when a group re-sends, 1 otherwise). Written by the scatter for each request it stores,
 * before it asks the pacer for a tick; a tick claims a due round with a compare-and-
 * exchange of due_ns, so one tick sends it. An entry whose req_id is not its slot's
 * current request, or whose slot is no longer pending, is spent. */
struct sg_stored {
	__u64 req_id;
	__u64 due_ns;       /* the next round (kedge_now()); 0: none */
	__u32 rounds;       /* rounds sent */
	__u32 len;          /* frame bytes in data; 0: not stored */
	__u64 sent_ns;      /* when it was scattered (kedge_now()): replies' times */
	__u32 ups;          /* samples above the delay estimate this request counted */
	__u32 _pad;
	__u64 resent[SG_BITMAP_WORDS];   /* bit i: worker i was sent a copy again */
	__u64 rep_first[SG_REP_WORDS];   /* SG_GF_REPLICAS: replica (2 bits) of the first copy */
	__u64 rep_last[SG_REP_WORDS];    /* and of the last copy */
	/* The frame as the coordinator sent it, its UDP checksum field 0 and 4 zero bytes
	 * after it; + SG_CSUM_CHUNK: the checksum sums it in chunks of that many bytes, each
	 * of which the verifier must see inside the value. */
	__u8 data[SG_STORE_BYTES + SG_CSUM_CHUNK];
};

/* budgets map value (key group): the re-send budget's saved milli-copies, and the delay
 * estimate of a group with resend_quantile_milli. */
struct sg_budget {
	__s64 tokens_milli;
	__u64 delay_ns; /* the estimated quantile of reply times (0: none yet) */
};

/* Ring-buffer record: one per completed request (ok or timeout). It lives inside the
 * slot while the request is in flight, so completion emits it with one copy. */
struct sg_result {
	__u64 req_id;
	__u64 start_ns;     /* bpf_ktime_get_ns() at scatter */
	__u64 done_ns;      /* at completion */
	__u16 group;
	__u16 slot;
	__u16 status;       /* enum sg_status */
	__u16 count;        /* replies aggregated */
	__u16 need;         /* replies that complete it */
	__u16 flags;        /* SG_F_* */
	__u16 gathered;     /* GATHER: payloads copied */
	__u16 partial;      /* workers some but not all of whose parts were reduced: they are
			     * not in the bitmap, their parts are in the aggregate */
	__u64 bitmap[SG_BITMAP_WORDS]; /* bit i: worker i answered */
	__u16 order[SG_GATHER_MAX];    /* GATHER: worker index of each copied payload */
	__s64 agg[SG_AGG_ELEMS];       /* accumulators (GATHER: the raw payload bytes) */
};

/* slots map value. The lock guards state, deadline_ns and res; not the timer. */
struct sg_slot {
	struct bpf_spin_lock lock;
	__u32 state;        /* enum sg_slot_state */
	__u64 deadline_ns;
	struct sg_result res;
	struct bpf_timer timer;
};

/* parts map value, one per (slot, worker) of a group with SG_GF_PARTS. Written only under
 * the slot's lock, by replies with nparts > 1 for the slot's current request. An entry
 * whose req_id is not the slot's request (or whose bits are 0) is free: nothing has to
 * clear it when a request completes or expires. */
struct sg_parts {
	__u64 req_id;
	__u32 bits;         /* bit p: part p arrived */
	__u16 nparts;       /* the worker's part count for this request */
	__u16 _pad;
};

/* Per-group counters (per-CPU array, SG_GROUPS_MAX slots; slot SG_GROUPS_MAX holds what
 * belongs to no group). Names match kedge sg stats. Every drop and every pass of a packet
 * that looked like sg has one. */
struct sg_stats {
	/* scatter (TC egress) */
	__u64 requests;        /* requests of a group seen by the scatter */
	__u64 copies;          /* copies sent to workers */
	__u64 copy_errors;     /* bpf_clone_redirect or a rewrite failed for one worker */
	__u64 slot_busy;       /* request's slot still pending: request dropped (never overwritten) */
	__u64 slot_range;      /* request's slot outside the group's range: dropped */
	__u64 not_owner;       /* request from another socket than the group's: passed */
	__u64 continued;       /* batches handed on to the interface's ingress (fan-out > batch) */
	__u64 cont_stopped;    /* handed-on request whose slot completed or was reused: rest dropped */
	/* replicas (SG_GF_REPLICAS) */
	__u64 ejections;       /* a replica ejected: a copy unanswered for judge_ns */
	__u64 shard_out;       /* every replica of a shard ejected: the copy went to one anyway */
	/* re-sends (SG_GF_RESEND) */
	__u64 retries;         /* copies sent again to the same worker (no other replica) */
	__u64 hedges;          /* copies sent again to another replica of the worker's shard */
	__u64 hedges_won;      /* re-sent shards answered first by another replica than the
				* first copy's */
	__u64 resend_refused;  /* copies the budget refused */
	__u64 resend_errors;   /* rebuilding the request or sending a copy failed */
	__u64 resend_unstored; /* requests too long to store: never re-sent */
	__u64 late_replies;    /* a re-sent worker's second reply (its other copy's): dropped */
	__u64 resend_rounds;   /* rounds a tick sent (a due round of a request still pending) */
	__u64 resend_late_ns;  /* the sum over those rounds of how late the tick came after the
				* round's due time (0 for a tick inside the pacer's early margin) */
	__u64 resend_again;    /* copies (in retries or hedges) to a worker re-sent in an earlier
				* round already: its earlier re-send went unanswered too */
	__u64 resend_censored; /* first re-sends counted as a sample above the delay estimate
				* (stored.h, quantile_censors) */
	/* gather (XDP ingress) */
	__u64 replies;         /* replies aggregated */
	__u64 completed;       /* requests completed by their policy */
	__u64 timeouts;        /* requests completed by the deadline */
	__u64 duplicates;      /* a worker's second reply to one request: dropped */
	__u64 late;            /* reply to a completed or timed-out request: dropped */
	__u64 stale;           /* reply whose id is not its slot's current request: dropped */
	__u64 unregistered;    /* source address/port is not that worker's: passed */
	__u64 bad_length;      /* payload length wrong for the group's reduction: passed */
	__u64 worker_errors;   /* reply with status != 0: dropped, not aggregated */
	__u64 multipart;       /* nparts > 1 for a group without SG_GF_PARTS or GATHER: passed */
	__u64 overflow;        /* an int64 sum wrapped (result flagged) */
	__u64 ringbuf_full;    /* result not emitted (user space reads the slot instead) */
	/* multi-packet replies (nparts > 1) */
	__u64 parts;           /* parts reduced (the one that completes a worker also counts
				* in replies) */
	__u64 part_dups;       /* a part that already arrived: dropped */
	__u64 bad_parts;       /* nparts > SG_PARTS_MAX, part >= nparts, an empty part (slice
				* beyond the vector) or a payload length wrong for its slice: passed */
	__u64 part_mismatch;   /* nparts differs from the worker's earlier parts: dropped */
	/* no group (global slot) or any group */
	__u64 unknown_group;   /* sg packet for a group that is not configured: passed */
	__u64 malformed;       /* looks like sg (magic) but short/truncated/bad op: passed */
	__u64 bad_version;     /* sg magic with another version: passed */
	__u64 sweeps;          /* expiry sweeps run (kernels without bpf_timer) */
	__u64 timer_errors;    /* bpf_timer_start failed: the sweep or user space expires it */
	/* user reductions (SG_RED_USER) */
	__u64 user_refused;    /* the user's reduction refused the reply: dropped, not answered */
	__u64 user_errors;     /* no program for the group (the tail call failed), or a user
				* reduction run other than by the gather: dropped */
};

/* sg_user_call map value (per-CPU, one entry): what the gather hands a user reduction it
 * tail-calls (sg_user.h). The gather writes it and sets armed; the user program clears
 * armed when it reads it, so a program not run by the gather finds nothing. */
struct sg_user_call {
	__u32 group;
	__u32 worker;
	__u32 off;   /* the sg header's offset in the packet */
	__u32 len;   /* payload bytes after it: elems * size, checked against the packet */
	__u32 armed;
	__u32 _pad;
};

/* The program's configuration, set by user space before load (const volatile sg_cfg,
 * bpf/sg/maps.h). */
struct sg_config {
	__u32 copy_mark; /* skb->mark on copies: not scattered again (KEDGE_MARK_SG_COPY) */
	__u32 cont_mark; /* skb->mark of a request handed on (KEDGE_MARK_SG_CONT) */
	/* Copies per run of the scatter. A run's copies all land in the sending CPU's backlog
	 * before the kernel delivers any of them (netdev_max_backlog, 1000 by default and not
	 * per network namespace: a burst of 1024 overflows it). After a batch, the request is
	 * handed on: marked cont_mark and redirected to the group interface's ingress, where
	 * sg_scatter_cont sends the next batch once the backlog has delivered this one. */
	__u32 batch;
	/* The first run sends only this many copies (at most batch), and each later run as
	 * many as have been sent so far, up to batch (8, 8, 16, 32, 64, 64, ...): the backlog
	 * delivers the first copies to their workers while the next runs are made, instead of
	 * after the first hop of a whole batch of 64 (docs/sg.md, "Batches"). */
	__u32 first_batch;
	/* The expiry timer fires this long after the deadline at the latest: a deadline that
	 * is this close counts as reached (bpf_timer lateness, kernel-notes). */
	__u64 expire_slack_ns;
};

#endif /* KEDGE_SG_H */
