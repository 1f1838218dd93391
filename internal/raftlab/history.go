// Package raftlab runs kedge raft clusters in a lab and judges them: node processes in
// namespaces behind the lab's fault fabric (cluster.go), concurrent clients that record
// what they asked and what they were told (history.go, workload.go) and a Porcupine check
// that the history is linearizable (linz.go).
package raftlab

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
	"sync"
	"time"
)

// Kind is an operation of the key-value API.
type Kind string

const (
	Get Kind = "get"
	Put Kind = "put"
	Del Kind = "del"
	CAS Kind = "cas"
)

// Op is one client operation: what was asked, when, and what came back. Times are
// nanoseconds since the history's start (real time, one clock: all clients run in one
// process).
type Op struct {
	Client int    `json:"client"`
	Kind   Kind   `json:"kind"`
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`  // put, cas: the new value
	Expect string `json:"expect,omitempty"` // cas
	// ExpectAbsent: cas succeeds only if the key does not exist.
	ExpectAbsent bool  `json:"expect_absent,omitempty"`
	Call         int64 `json:"call"`
	Return       int64 `json:"return"`
	Out          Out   `json:"out"`
	Node         int   `json:"node,omitempty"` // which node was asked (for the report)
}

// Out is an operation's result.
type Out struct {
	// Unknown: the outcome is not known (timeout, broken connection): a write may or may not
	// have taken effect. Such an op is checked as if it returned at the end of time.
	Unknown bool   `json:"unknown,omitempty"`
	OK      bool   `json:"ok,omitempty"`    // cas: swapped; put/del: acknowledged
	Found   bool   `json:"found,omitempty"` // get: the key exists; cas failed: it exists
	Value   string `json:"value,omitempty"` // get: the value; failed cas: the current value
	Err     string `json:"err,omitempty"`
}

// History records operations from concurrent clients.
type History struct {
	start time.Time
	mu    sync.Mutex
	ops   []Op
}

// NewHistory starts the clock.
func NewHistory() *History { return &History{start: time.Now()} }

// Now is the history's clock.
func (h *History) Now() int64 { return int64(time.Since(h.start)) }

// Add records a finished op. An op that definitely failed (Err set, not Unknown: refused
// before it could take effect) is not recorded: it did nothing. A get whose outcome is
// unknown is not recorded either: a read has no effect to account for.
func (h *History) Add(op Op) {
	if op.Out.Err != "" && !op.Out.Unknown {
		return
	}
	if op.Out.Unknown && op.Kind == Get {
		return
	}
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
}

// Ops returns the recorded operations sorted by call time.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	ops := append([]Op(nil), h.ops...)
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	return ops
}

// endOfTime is the return time given to ops with unknown outcome: after every other op.
const endOfTime = math.MaxInt64

// WriteJSON writes ops to path.
func WriteJSON(path string, ops []Op) error {
	b, err := json.MarshalIndent(ops, "", " ")
	if err != nil {
		return fmt.Errorf("encode history: %w", err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("write history: %w", err)
	}
	return nil
}

// ReadJSON reads a history written by WriteJSON.
func ReadJSON(path string) ([]Op, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read history: %w", err)
	}
	var ops []Op
	if err := json.Unmarshal(b, &ops); err != nil {
		return nil, fmt.Errorf("decode history %s: %w", path, err)
	}
	return ops, nil
}
