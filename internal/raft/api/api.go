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
}

// Status answers GET /v1/status.
type Status struct {
	ID               uint64   `json:"id"`
	ClusterID        uint64   `json:"cluster_id"`
	State            string   `json:"state"`
	Leader           uint64   `json:"leader"`
	Term             uint64   `json:"term"`
	Commit           uint64   `json:"commit"`
	Applied          uint64   `json:"applied"`
	LastIndex        uint64   `json:"last_index"`
	SnapshotIndex    uint64   `json:"snapshot_index"`
	LastHeartbeatMs  *float64 `json:"last_heartbeat_ms"`
	UnsafeLocalReads bool     `json:"unsafe_local_reads"`
	// Offload is the follower kernel path ("xdp-native on eth0"); empty when off.
	Offload string       `json:"offload,omitempty"`
	Peers   []PeerStatus `json:"peers,omitempty"`
}
