// Package api holds the JSON types of kedge raft's client API (docs/raft.md section 2),
// shared by the node's HTTP server and the Go client.
package api

// Limits of the client API.
const (
	MaxKey   = 256
	MaxValue = 64 << 10
	MaxBody  = MaxValue + 4<<10
)

// GetResponse answers GET /v1/kv/{key}.
type GetResponse struct {
	Key   string `json:"key"`
	Value string `json:"value"`
	Found bool   `json:"found"`
	Index uint64 `json:"index"`
}

// PutRequest is the body of PUT /v1/kv/{key}.
type PutRequest struct {
	Value string `json:"value"`
}

// CASRequest is the body of POST /v1/cas/{key}. Expect is compared with the current value;
// ExpectAbsent instead requires that the key does not exist.
type CASRequest struct {
	Expect       string `json:"expect"`
	ExpectAbsent bool   `json:"expect_absent,omitempty"`
	Value        string `json:"value"`
}

// WriteResponse answers PUT, DELETE and CAS. For a CAS that did not swap (OK false), Found
// and Value are the current state; for DELETE, Found says whether the key existed.
type WriteResponse struct {
	OK    bool   `json:"ok"`
	Found bool   `json:"found,omitempty"`
	Value string `json:"value,omitempty"`
	Index uint64 `json:"index"`
}

// Outcome of a failed write.
const (
	OutcomeNone    = "none"    // not applied
	OutcomeUnknown = "unknown" // may still commit
)

// Error is the body of every non-200 response.
type Error struct {
	Error   string `json:"error"`
	Hint    string `json:"hint,omitempty"`
	Outcome string `json:"outcome"`
	Leader  uint64 `json:"leader"`
}

// PeerStatus is the leader's view of one follower.
type PeerStatus struct {
	ID          uint64   `json:"id"`
	Match       uint64   `json:"match"`
	Next        uint64   `json:"next"`
	State       string   `json:"state"`
	LastHeardMs *float64 `json:"last_heard_ms"`
	// TransportHeardMs, KernelHeardMs: LastHeardMs by each record, the leader's transport
	// (what its user space received from the follower) and, with the kernel paths, its
	// program's record of the follower's heartbeat responses; absent when that record never
	// heard it. LastHeardMs is the smaller.
	TransportHeardMs *float64 `json:"transport_heard_ms,omitempty"`
	KernelHeardMs    *float64 `json:"kernel_heard_ms,omitempty"`
}

// Status answers GET /v1/status.
type Status struct {
	ID              uint64   `json:"id"`
	ClusterID       uint64   `json:"cluster_id"`
	State           string   `json:"state"`
	Leader          uint64   `json:"leader"`
	Term            uint64   `json:"term"`
	Commit          uint64   `json:"commit"`
	Applied         uint64   `json:"applied"`
	LastIndex       uint64   `json:"last_index"`
	SnapshotIndex   uint64   `json:"snapshot_index"`
	LastHeartbeatMs *float64 `json:"last_heartbeat_ms"`
	// TransportHeartbeatMs, KernelHeartbeatMs: a follower's LastHeartbeatMs by each record,
	// its transport's (what its user space received from the leader) and, with the kernel
	// paths, its program's (the leader's heartbeats it answered without waking the node);
	// absent when that record never heard the leader. LastHeartbeatMs is the smaller.
	TransportHeartbeatMs *float64 `json:"transport_heartbeat_ms,omitempty"`
	KernelHeartbeatMs    *float64 `json:"kernel_heartbeat_ms,omitempty"`
	UnsafeLocalReads     bool     `json:"unsafe_local_reads"`
	// Offload is the follower kernel path ("xdp-native on eth0"); empty when off.
	Offload string `json:"offload,omitempty"`
	// AliveBoundMs, HeartbeatLeaseMs: the kernel paths' bounds in force (docs/raft.md, "The
	// adaptive bound"): how long the follower program answers for the node after its loop's
	// last refresh, and how long one renewal keeps the kernel heartbeating for it as leader;
	// absent when that path is off.
	AliveBoundMs     *float64     `json:"alive_bound_ms,omitempty"`
	HeartbeatLeaseMs *float64     `json:"heartbeat_lease_ms,omitempty"`
	Peers            []PeerStatus `json:"peers,omitempty"`
}

// Event kinds of GET /v1/events: what a node saw of an election, in order.
const (
	EventDetector     = "detector"      // the kernel's failure detector fired (Detail: campaign, or why not)
	EventPreCandidate = "pre-candidate" // etcd-raft started a pre-vote (HeardNs: the leader last heard)
	EventCandidate    = "candidate"     // a pre-vote quorum: a real election, term and own vote durable
	EventLeader       = "leader"        // this node won (Term)
	EventFollower     = "follower"      // this node follows (Leader, 0 while unknown)
	EventVote         = "vote"          // this node granted its (durable) vote to Peer
	EventCommitted    = "committed"     // as leader: the first entry of its term committed (Detail: index)
	EventLease        = "lease"         // a vote request from Peer found the leader's lease over in real time (HeardNs: the leader last heard)
	// EventSlowSave: saving a Ready (write and fsync) held the node's persist/apply loop
	// longer than its alive bound (AtNs: when the save started, SaveNs: how long it took,
	// Detail: its entries); with the follower kernel path the program stopped answering for
	// the node at most the alive bound after AtNs.
	EventSlowSave = "slow-save"
	// EventBound: the adaptive alive bound and lease moved by a tenth or more (BoundNs: the
	// new bound).
	EventBound = "bound"
)

// Event is one entry of a node's election record. Times are CLOCK_MONOTONIC ns: every
// process on the machine shares the clock, so a harness can line up several nodes' records
// with its own timestamps.
type Event struct {
	AtNs    int64  `json:"at_ns"`
	Kind    string `json:"kind"`
	Term    uint64 `json:"term"`
	Leader  uint64 `json:"leader,omitempty"`
	Peer    uint64 `json:"peer,omitempty"`
	HeardNs int64  `json:"heard_ns,omitempty"` // last message from the leader (0: never)
	// SaveNs (candidate): how long saving the Ready that carried the new term and the own
	// vote took (the fsync the candidate waits for before its vote requests go out).
	SaveNs int64 `json:"save_ns,omitempty"`
	// BoundNs (slow-save, bound): the alive bound in force when the save began, the new
	// adaptive bound.
	BoundNs int64  `json:"bound_ns,omitempty"`
	Detail  string `json:"detail,omitempty"`
}

// Events answers GET /v1/events?since_ns=N: the node's election record after N (at most the
// last 256 events).
type Events struct {
	NowNs  int64   `json:"now_ns"`
	Events []Event `json:"events"`
}

// Leader answers GET /v1/leader?after_term=N&wait=D: as soon as the node knows a leader in
// a term above N (or when D has passed: then Leader may be 0).
type Leader struct {
	ID     uint64 `json:"id"` // the node that answers
	Leader uint64 `json:"leader"`
	Term   uint64 `json:"term"`
	Client string `json:"client,omitempty"` // the leader's client address (from the config)
}
