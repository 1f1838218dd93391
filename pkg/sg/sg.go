// Package sg is kedge's scatter-gather primitive: an application sends ONE datagram and
// the kernel fans it out to every worker of a group (TC egress), reduces the workers'
// replies as they arrive (XDP ingress) and hands the application only the final result,
// through a ring buffer. Requests that are not complete by their deadline complete in the
// kernel with status Timeout, the partial aggregate and the set of workers that answered.
//
// A Group is one coordinator socket on one interface with its workers and its reduction:
//
//	g, err := sg.Open(sg.Config{
//		Interface: "eth0",
//		Workers:   []netip.AddrPort{netip.MustParseAddrPort("10.0.0.2:9000"), ...},
//		Reduction: sg.Sum, Type: sg.Int64, Elems: 4,
//		Timeout:   10 * time.Millisecond,
//	})
//	res, err := g.Scatter(ctx, []byte("query"))
//	// res.Values: the element-wise sum; res.Answered: who answered; res.Status
//
// Scatter is safe from many goroutines; up to Config.InFlight requests are outstanding
// at once, and when all are in flight Scatter blocks or fails with ErrInFlight, as
// Config.OnFull says. Workers speak the wire format in docs/sg.md (kedge sg worker is the
// reference implementation). One Group per interface: XDP allows one program per device.
//
// Opening a group needs root (CAP_BPF + CAP_NET_ADMIN) and Linux 5.10 or later.
package sg

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	isg "github.com/kedge-dev/kedge/internal/sg"
)

// Reduction is how the workers' replies combine.
type Reduction int

const (
	Sum    Reduction = iota // element-wise sum (int32 summed in int64: no wrap; int64 wrap is flagged)
	Min                     // element-wise minimum
	Max                     // element-wise maximum
	Count                   // number of replies; payloads are not read
	Gather                  // the first GatherK payloads, concatenated in arrival order
	// Mean is the element-wise sum (reduced in the kernel as Sum) divided by the replies
	// counted, in Result.Floats; not with MultiPacket (a partial reply's parts would be
	// in the sum but not the count).
	Mean
	// User is a reduction written in C by the user (Config.UserReduction; docs/sg.md,
	// "User reductions"): the kernel hands it each reply that passed the checks every reply
	// passes, and Result.Values is its Elems accumulators. Int32 and Int64 only; not with
	// MultiPacket or Resend.
	User
)

func (r Reduction) String() string {
	switch r {
	case Sum:
		return "sum"
	case Min:
		return "min"
	case Max:
		return "max"
	case Count:
		return "count"
	case Gather:
		return "gather"
	case Mean:
		return "mean"
	case User:
		return "user"
	}
	return fmt.Sprintf("Reduction(%d)", int(r))
}

// ParseReduction parses "sum", "min", "max", "count", "gather", "mean" or "user".
func ParseReduction(s string) (Reduction, error) {
	for r := Sum; r <= User; r++ {
		if r.String() == s {
			return r, nil
		}
	}
	return 0, fmt.Errorf("unknown reduction %q (want sum, min, max, count, gather, mean or user)", s)
}

// kernel is the data plane's reduction (enum sg_reduce): Mean is reduced as Sum.
func (r Reduction) kernel() uint8 {
	switch r {
	case Mean:
		return isg.RedSum
	case User:
		return isg.RedUser
	}
	return uint8(r)
}

// UserReduction names a reduction written by the user (Config.UserReduction): the BPF
// object built from it (bpf/include/sg_user.h; docs/sg.md, "User reductions") and the program in it
// that SG_USER_REDUCTION made ("": the object's only XDP program).
type UserReduction struct {
	Object  string
	Program string
}

// ElemType is the type of the elements of a reply vector.
type ElemType int

const (
	Int32 ElemType = iota
	Int64
	// Float32 and Float64 vectors are reduced by the kernel as integers that their
	// workers send in place of the floats (FloatEncoding; docs/sg.md, "Float
	// reductions"): Min and Max exactly, Sum and Mean in fixed point with
	// Config.FracBits fraction bits (error bound: SumErrorBound). The result is in
	// Result.Floats.
	Float32
	Float64
)

func (t ElemType) String() string {
	switch t {
	case Int32:
		return "int32"
	case Int64:
		return "int64"
	case Float32:
		return "float32"
	case Float64:
		return "float64"
	}
	return fmt.Sprintf("ElemType(%d)", int(t))
}

// ParseElemType parses "int32", "int64", "float32" or "float64".
func ParseElemType(s string) (ElemType, error) {
	switch s {
	case "int32", "i32":
		return Int32, nil
	case "int64", "i64":
		return Int64, nil
	case "float32", "f32":
		return Float32, nil
	case "float64", "f64":
		return Float64, nil
	}
	return 0, fmt.Errorf("unknown element type %q (want int32, int64, float32 or float64)", s)
}

// Size is the byte size of one element as the application holds it (Gather: a
// payload is Elems * Size bytes). A float vector's wire form may differ
// (FloatEncoding.ElemSize).
func (t ElemType) Size() int {
	if t == Int64 || t == Float64 {
		return 8
	}
	return 4
}

// IsFloat: Float32 or Float64.
func (t ElemType) IsFloat() bool { return t == Float32 || t == Float64 }

// ReplicaChoice is how the scatter picks a shard's replica (Config.ReplicaChoice).
type ReplicaChoice int

const (
	RoundRobin    ReplicaChoice = iota // (request sequence + shard) mod replicas
	LowestLatency                      // lowest estimated median reply time
)

func (c ReplicaChoice) String() string {
	switch c {
	case RoundRobin:
		return "rr"
	case LowestLatency:
		return "latency"
	}
	return fmt.Sprintf("ReplicaChoice(%d)", int(c))
}

// ParseReplicaChoice parses "rr" or "latency".
func ParseReplicaChoice(s string) (ReplicaChoice, error) {
	for c := RoundRobin; c <= LowestLatency; c++ {
		if c.String() == s {
			return c, nil
		}
	}
	return 0, fmt.Errorf("unknown replica choice %q (want rr or latency)", s)
}

// OnFull says what Scatter does when every request slot is in flight.
type OnFull int

const (
	Block OnFull = iota // wait for a slot (or the context)
	Fail                // return ErrInFlight at once
)

// Limits of the data plane (bpf/include/sg.h).
const (
	MaxWorkers  = 1024 // workers per group
	MaxInFlight = 1024 // request slots
	// MaxScatterBatch: copies per scatter run (Config.ScatterBatch), 32 x 33 tail calls on
	// kernels without bpf_loop.
	MaxScatterBatch = 32 * 33
	MaxElems        = 256 // vector elements (Sum, Min, Max, Mean) of any type
	MaxGatherK      = 64  // Gather: replies kept
	MaxParts        = 32  // datagrams of one multi-packet reply (Config.MultiPacket)
	MaxReplicas     = 4   // replicas of one shard (Config.Replicas)
	MaxResendRounds = 16  // rounds of re-sends per request (Config.MaxResends)
	// MaxResendFrame: a request frame (Ethernet to the payload's end) longer than this is
	// never re-sent (Stats.ResendUnstored).
	MaxResendFrame = 1536
	AggBytes       = 2048 // Gather: GatherK * Elems * Type.Size() must fit
)

// Config describes a group.
type Config struct {
	// Interface the workers are reached through (the coordinator's side). "lo" works.
	Interface string
	// Netns, if set, is the network namespace (a name under /run/netns or a path) the
	// interface and the coordinator socket live in.
	Netns string
	// Workers in index order; all IPv4 or all IPv6, all reached through Interface.
	Workers []netip.AddrPort
	// Local is the coordinator socket's address; zero: the route's source address
	// towards Workers[0] and an ephemeral port.
	Local netip.AddrPort
	// Group is the group id on the wire (workers echo it).
	Group uint16
	// Replicas makes the workers shards with replicas: Replicas[i], if set, are further
	// processes that answer for shard i as Workers[i] does (at most MaxReplicas in all,
	// same family and interface; shard i may have none). Each request's copy for shard i
	// goes to one of them, round robin by request over the replicas not ejected; a reply
	// from any of them answers for the shard (Result.Answered names shards). A replica
	// that leaves a copy unanswered for Timeout (with no reply from it since) is ejected
	// for EjectBackoff, doubled with each ejection in a row up to EjectMaxBackoff; its next
	// reply makes it good again (docs/sg.md, "Replicas").
	Replicas [][]netip.AddrPort
	// ReplicaChoice is how a shard's replica is picked for each copy: RoundRobin (by
	// request) or LowestLatency (the replica with the lowest estimated median reply time,
	// which every reply from it steps; one with no estimate yet is tried first). Ejected
	// replicas are skipped either way.
	ReplicaChoice ReplicaChoice
	// EjectBackoff is a replica's first back-off (default 1 s; negative: never eject);
	// EjectMaxBackoff the longest (default 30 s, at least EjectBackoff).
	EjectBackoff    time.Duration
	EjectMaxBackoff time.Duration

	Reduction Reduction
	// UserReduction is the reduction of a group with Reduction User: Open loads it and
	// refuses an object that is not one, was built against another kedge's headers, or
	// that the verifier rejects (the error says which; a verifier rejection is a
	// *bpfx.LoadError with the log's last lines).
	UserReduction UserReduction
	Type          ElemType
	// FracBits: Float32/Float64 Sum and Mean travel in fixed point with this many
	// fraction bits (default DefaultFracBits, 32: values below 2^31 in magnitude,
	// resolution 2^-32; at most MaxFracBits). Workers must encode with the same
	// (FloatEncoding).
	FracBits int
	// Elems is the vector length (Sum, Min, Max, Mean; Gather: payload = Elems *
	// Type.Size()).
	Elems int
	// GatherK: Gather keeps the first GatherK payloads (default: as many as fit).
	GatherK int
	// Need is how many replies complete a request: 0 = all (WaitAll), 1 = any, N = N of M.
	Need int
	// Timeout is the default deadline of a request (default 100 ms).
	Timeout time.Duration
	// InFlight is how many requests may be outstanding (default 256, max MaxInFlight).
	InFlight int
	OnFull   OnFull
	// ScatterBatch is how many copies one run of the scatter program sends before it
	// hands the request on (through the interface's ingress) for the next batch; default
	// 64, at most MaxScatterBatch. A run's copies all wait in the sending CPU's backlog,
	// which holds net.core.netdev_max_backlog packets (1000 by default, host-wide): a
	// batch larger than that loses copies.
	ScatterBatch int
	// ScatterFirstBatch is how many copies the first run sends (default min(8,
	// ScatterBatch), at most ScatterBatch); each later run sends as many as were sent
	// before it, up to ScatterBatch (8, 8, 16, 32, 64, 64, ...). Small first runs let the
	// backlog deliver the first copies, and the workers start on them, while the rest are
	// made: one run of 64 holds every copy back until all 64 have been made and have taken
	// their first hop (docs/sg.md, "Batches"). ScatterFirstBatch = ScatterBatch sends
	// equal batches.
	ScatterFirstBatch int
	// BusyPoll makes the result reader spin on the ring buffer instead of sleeping in
	// epoll: lower latency, one core busy while the group is open. The completing reply
	// is then consumed in XDP like every other.
	BusyPoll bool
	// PollSpin is how long the ring's reader polls for the next result, while requests
	// are outstanding, before it sleeps until the ring wakes it; it polls only while the
	// results' recent spacing is within it (docs/sg.md, "Delivery"); with 4 or more
	// requests in flight it naps 20 us between looks rather than spinning. 0: DefaultPollSpin;
	// negative: never (the reader sleeps as soon as it has read the ring); at most
	// MaxPollSpin. Polling spends the reader's CPU while it waits: a user who counts CPU
	// rather than latency sets it negative (`kedge sg scatter --poll-spin 0`). Ignored
	// with BusyPoll and with WakeSocket.
	PollSpin time.Duration
	// WakeSocket makes the reply that completes a request wake the reader: the data plane
	// passes it to the coordinator socket (SG_GF_WAKE_SOCKET) and emits its result without
	// the ring buffer's wake-up (irq_work); the reader waits on the socket and the ring in
	// the Go runtime's poller. Timeouts wake it through the ring either way. Off by
	// default: on the development VM it was not faster than the ring's wake-up and costs a
	// datagram through the stack and ~1.2 more system calls per request (docs/sg.md,
	// "Latency"); `kedge bench sg` runs it as kedge-sock, side by side. Ignored with
	// BusyPoll.
	WakeSocket bool
	// MultiPacket makes the group take multi-packet replies: a worker whose vector does
	// not fit one datagram sends it in up to MaxParts parts (docs/sg.md, "Multi-packet
	// replies"), each reduced in the kernel as it arrives; the worker has answered when
	// all its parts have. Costs a parts map of InFlight x workers x 16 bytes. Not with
	// Gather (single-packet replies only). Single-packet replies are taken either way.
	MultiPacket bool
	// Resend turns re-sends on: a worker that has not answered a request Resend after it
	// was scattered gets its copy again, built in the kernel from the stored request at a
	// tick of the pacer (docs/sg.md, "Re-sends"): to the next replica of its shard (a
	// hedge) or, with none, to the same worker (a retry). The first reply counts; a later
	// one is dropped (Stats.LateReplies). Workers must answer a request they see twice as
	// they answered it once, and replicas of a shard alike. 0: off. Must be below
	// Timeout; not with MultiPacket. Needs bpf_loop (5.17+) and starts a pacer: its own
	// network namespace and a veth pair into the group's (internal/pacer).
	Resend time.Duration
	// MaxResends is how many rounds of re-sends a request may have, Resend apart (with
	// Replicas and ResendQuantile: a round after a round half the delay on, at least
	// ResendMin; default 1, at most MaxResendRounds).
	MaxResends int
	// ResendQuantile, if set (0 < q < 1), makes the delay adaptive: the group's q-quantile
	// of reply times, estimated in the kernel from every first reply of a worker that was
	// not re-sent, clamped to [ResendMin, Resend]; Resend until the first reply.
	ResendQuantile float64
	// ResendMin is the adaptive delay's floor (default Resend / 10).
	ResendMin time.Duration
	// ResendBudget bounds the copies re-sent (default Ratio 0.1, Burst
	// DefaultResendBurst).
	ResendBudget ResendBudget
	// PacerBackend is the pacer's delay line: auto (default), edt, netem or conveyor
	// (docs/pacer.md).
	PacerBackend string
	// StatusDir, if set, is where the group publishes sg.<owner>.json (counters and
	// configuration, every second; kedge's run-state status files) for `kedge sg stats`,
	// which reads /run/kedge.
	StatusDir string
}

// ResendBudget bounds re-sends like the hedger's token bucket: each request saves Ratio x
// its copies while fewer than Burst are saved, and each re-sent copy spends one (refused
// when none is left: Stats.ResendRefused). Over any run, copies re-sent <= Ratio x copies
// scattered + Burst.
type ResendBudget struct {
	Ratio float64
	Burst int
}

// DefaultResendBurst is the default ResendBudget.Burst of a group of n workers: 8 x n, at
// least 16. A round of a request late as a whole (a worker host descheduled, host steal)
// re-sends every worker, and such requests come several in a row; with a burst of 2 x n
// two of them emptied the bucket, and the stragglers of the requests after them waited
// unhedged (fan-out 64, 1% stragglers: 3,482 copies refused over 8 rounds against 76 with
// 8 x n, the same extra load; docs/sg.md, Tail benchmark). The bound over a run stays
// Ratio x copies + Burst.
func DefaultResendBurst(n int) int {
	return max(16, 8*n)
}

// DefaultPollSpin is Config.PollSpin's default: at a fan-out of 4 with one request
// outstanding a result follows the previous one within about 100 us on the development
// VM, and at 32 outstanding within tens of microseconds.
const DefaultPollSpin = 200 * time.Microsecond

// MaxPollSpin is the longest Config.PollSpin: a reader that polls longer between results
// is a busy-polling one (Config.BusyPoll).
const MaxPollSpin = 10 * time.Millisecond

// Status of a result.
type Status int

const (
	OK      Status = iota // completed by its policy
	Timeout               // deadline passed first: partial aggregate
)

func (s Status) String() string {
	if s == Timeout {
		return "timeout"
	}
	return "ok"
}

// MarshalText makes Status print as text in JSON.
func (s Status) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText parses "ok" or "timeout".
func (s *Status) UnmarshalText(b []byte) error {
	switch string(b) {
	case "ok":
		*s = OK
	case "timeout":
		*s = Timeout
	default:
		return fmt.Errorf("unknown sg status %q", b)
	}
	return nil
}

// GatherItem is one payload kept by Gather.
type GatherItem struct {
	Worker  int    `json:"worker"`
	Payload []byte `json:"payload"`
}

// Result of one request.
type Result struct {
	ID     uint64 `json:"id"`
	Status Status `json:"status"`
	// Answered lists the indexes (into Config.Workers) of the workers whose reply counted.
	Answered []int `json:"answered"`
	Count    int   `json:"count"`
	Need     int   `json:"need"`
	// Values is the element-wise aggregate of an integer group (Sum, Min, Max; Mean: the
	// sums); nil for Count and Gather, for float groups, and for Min/Max when nobody
	// answered.
	Values []int64 `json:"values,omitempty"`
	// Floats is the element-wise aggregate of a float group (Sum, Min, Max, Mean) and the
	// mean of an integer one; nil when nobody answered (Sum: zeros). JSON writes NaN and
	// infinities as the strings "NaN", "+Inf" and "-Inf".
	Floats   Floats       `json:"floats,omitempty"`
	Gathered []GatherItem `json:"gathered,omitempty"`
	// Overflow: an int64 sum wrapped (a float Sum or Mean: a fixed-point sum; Floats
	// are then not the sum: use fewer FracBits).
	Overflow bool `json:"overflow,omitempty"`
	// Partial lists the workers (MultiPacket) some but not all of whose parts arrived
	// before the request completed or expired: they are not in Answered, and the parts
	// they sent ARE in Values (each part's slice: PartSlice). For Min and Max an element
	// that no arrived reply or part covered is 0 (floats: NaN).
	Partial []PartialReply `json:"partial,omitempty"`
	// Kernel is the time from the scatter to the completing reply (or the expiry),
	// measured in the kernel; RoundTrip is Scatter's own duration.
	Kernel    time.Duration `json:"kernel_ns"`
	RoundTrip time.Duration `json:"round_trip_ns"`
	// Reader is what brought the result to the application: "ring" (the ring buffer's
	// wake-up), "socket" (WakeSocket: the completing reply's arrival on the coordinator
	// socket), "busy-poll" (the spinning reader) or "guard" (the Scatter's guard timer
	// read it: a lost wake-up, or a full ring; docs/sg.md, "Delivery").
	Reader string `json:"reader"`
}

// PartialReply is a worker's incomplete multi-packet reply (Result.Partial).
type PartialReply struct {
	Worker int   `json:"worker"`
	NParts int   `json:"nparts"`
	Parts  []int `json:"parts"` // the part indexes that arrived, ascending
}

// PartSlice is the slice of an elems-long vector that part part of an nparts-part reply
// carries: elements [off, off+n) (docs/sg.md, wire format). ok is false for a part that
// cannot exist (part >= nparts, nparts above MaxParts, or an empty part).
func PartSlice(elems, nparts, part int) (off, n int, ok bool) {
	return isg.PartSlice(elems, nparts, part)
}

// RequestOptions override the group's policy for one request.
type RequestOptions struct {
	Need    int           // 0: the group's
	Timeout time.Duration // 0: the group's; rounded to microseconds
}

// Stats are the data plane's counters (docs/sg.md lists their meaning).
type Stats struct {
	Requests    uint64 `json:"requests"`
	Copies      uint64 `json:"copies"`
	CopyErrors  uint64 `json:"copy_errors"`
	SlotBusy    uint64 `json:"slot_busy"`
	SlotRange   uint64 `json:"slot_range"`
	NotOwner    uint64 `json:"not_owner"`
	Continued   uint64 `json:"continued"`
	ContStopped uint64 `json:"cont_stopped"`
	Ejections   uint64 `json:"ejections"`
	ShardOut    uint64 `json:"shard_out"`
	// Re-sends (Config.Resend): copies sent again to the same worker (retries) or to
	// another replica of its shard (hedges), shards a hedge answered first, copies the
	// budget refused, failures, requests too long to store, second replies of re-sent
	// workers (dropped).
	Retries        uint64 `json:"retries"`
	Hedges         uint64 `json:"hedges"`
	HedgesWon      uint64 `json:"hedges_won"`
	ResendRefused  uint64 `json:"resend_refused"`
	ResendErrors   uint64 `json:"resend_errors"`
	ResendUnstored uint64 `json:"resend_unstored"`
	LateReplies    uint64 `json:"late_replies"`
	// Rounds of re-sends a tick sent, the sum of how late those ticks came after their
	// rounds' due times (ResendLateNs / ResendRounds: the pacer's mean lateness), copies
	// to a worker whose earlier re-send went unanswered too, and first re-sends counted as
	// a sample above the delay estimate (Config.ResendQuantile; docs/sg.md).
	ResendRounds   uint64 `json:"resend_rounds"`
	ResendLateNs   uint64 `json:"resend_late_ns"`
	ResendAgain    uint64 `json:"resend_again"`
	ResendCensored uint64 `json:"resend_censored"`
	Replies        uint64 `json:"replies"`
	Completed      uint64 `json:"completed"`
	Timeouts       uint64 `json:"timeouts"`
	Duplicates     uint64 `json:"duplicates"`
	Late           uint64 `json:"late"`
	Stale          uint64 `json:"stale"`
	Unregistered   uint64 `json:"unregistered"`
	BadLength      uint64 `json:"bad_length"`
	WorkerErrors   uint64 `json:"worker_errors"`
	Multipart      uint64 `json:"multipart"`
	Overflow       uint64 `json:"overflow"`
	RingbufFull    uint64 `json:"ringbuf_full"`
	Parts          uint64 `json:"parts"`
	PartDups       uint64 `json:"part_dups"`
	BadParts       uint64 `json:"bad_parts"`
	PartMismatch   uint64 `json:"part_mismatch"`
	UnknownGroup   uint64 `json:"unknown_group"`
	Malformed      uint64 `json:"malformed"`
	BadVersion     uint64 `json:"bad_version"`
	Sweeps         uint64 `json:"sweeps"`
	TimerErrors    uint64 `json:"timer_errors"`
	// User reductions: replies the user's reduction refused (dropped, not answered), and
	// replies dropped because the group's program is missing.
	UserRefused uint64 `json:"user_refused"`
	UserErrors  uint64 `json:"user_errors"`
}

// Errors.
var (
	// ErrInFlight: every request slot is in flight and Config.OnFull is Fail.
	ErrInFlight = errors.New("sg: every request slot is in flight (raise Config.InFlight or use OnFull: Block)")
	// ErrClosed: the group was closed.
	ErrClosed = errors.New("sg: group closed")
	// ErrLost: neither the ring buffer nor the slot delivered the result in time.
	ErrLost = errors.New("sg: result lost (slot kept out of use)")
)
