package raftbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/raft/offload"
	"github.com/kedge-dev/kedge/internal/raftlab"
)

// False elections: leader changes while nothing failed, counted over a quiet window.

// FalseElections is one run without any crash: leader changes seen while it lasted.
type FalseElections struct {
	Offload           string  `json:"offload"`
	Scenario          string  `json:"scenario"` // idle, spinners (2 per CPU), starved-follower, stress, stress-disk
	Nodes             int     `json:"nodes"`
	ElectionTicks     int     `json:"election_ticks"`
	ElectionTimeoutMs float64 `json:"election_timeout_ms"`
	DurationS         float64 `json:"duration_s"`
	LeaderChanges     int     `json:"leader_changes"` // new (term, leader) pairs after the first
	TermIncrease      uint64  `json:"term_increase"`
	PerMinute         float64 `json:"per_minute"`
	// stress-disk: the writes acknowledged and failed during the run (StallWriters
	// closed-loop writers to the leader), and the stalled node.
	Writes      int `json:"writes,omitempty"`
	WriteErrors int `json:"write_errors,omitempty"`
	Stalled     int `json:"stalled_node,omitempty"`
	// Stall: a kedge cluster's slow saves in a stress-disk run, and whether the stalled node
	// stopped answering for itself within the alive bound (nil: etcd, or another phase).
	Stall *StallRecord `json:"stall,omitempty"`
	// WALFsync: the nodes' WAL fsyncs in a stress-disk run, the stalled node's apart (nil:
	// another phase, or a node whose metrics could not be read).
	WALFsync *WALFsyncRecord `json:"wal_fsync,omitempty"`
	// UntilChange: the run was to end at its first leader or term change (--fe-until-change),
	// so a run shorter than asked for saw one.
	UntilChange bool `json:"until_change,omitempty"`
	// LoadStart, LoadEnd: /proc/loadavg (1, 5, 15 min) when the phase began and ended.
	LoadStart []float64 `json:"load_start,omitempty"`
	LoadEnd   []float64 `json:"load_end,omitempty"`
}

// StallWriters write during a stress-disk phase, so that the stalled node has appends to
// fsync.
const StallWriters = 4

// stressed says whether phase starves a follower.
func stressed(phase string) bool {
	return phase == "starved-follower" || phase == "stress" || phase == "stress-disk"
}

// falseElections watches leader changes with no crash, in each phase of o.FalsePhases,
// with the clusters of both modes running at the same time under the same pressure.
func (o *Options) falseElections(ctx context.Context, electionTicks int) (out []FalseElections, err error) {
	if len(o.FalseModes) > 0 {
		fo := *o
		fo.Modes, fo.FalseModes = o.FalseModes, nil
		return fo.falseElections(ctx, electionTicks)
	}
	cs, closeAll, err := o.clusters(ctx, fmt.Sprintf("rbe%d", electionTicks), o.Nodes, electionTicks)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, closeAll()) }()
	for _, sc := range o.FalsePhases {
		var stops []func() error
		stopAll := func() error {
			var errs []error
			for _, s := range stops {
				errs = append(errs, s())
			}
			stops = nil
			return errors.Join(errs...)
		}
		leaders, stalled := make([]int, len(o.Modes)), make([]int, len(o.Modes))
		for i, mode := range o.Modes {
			leader, err := stableLeader(ctx, cs[mode])
			if err == nil && sc == "stress-disk" {
				leader, err = o.moveLeader(ctx, cs[mode], o.stallNode())
			}
			if err != nil {
				return out, errors.Join(err, stopAll())
			}
			leaders[i] = leader
			if !stressed(sc) {
				continue
			}
			follower := 1
			if leader == 1 {
				follower = 2
			}
			s, err := lab.Starve(cs[mode].PID(follower), runtime.NumCPU()-1, 3)
			if err != nil {
				return out, errors.Join(err, stopAll())
			}
			stops = append(stops, s.Stop)
			if sc != "stress-disk" {
				continue
			}
			// The other follower's disk stalls: the node with a disk of its own.
			stalled[i] = o.stallNode()
			d, err := cs[mode].StallDisk(stalled[i], o.StallIOPS)
			if err != nil {
				return out, errors.Join(err, stopAll())
			}
			stops = append(stops, d.Stop)
		}
		switch sc {
		case "spinners", "stress", "stress-disk":
			n := 2 * runtime.NumCPU()
			if sc != "spinners" {
				n = runtime.NumCPU()
			}
			s, err := bench.Spin(n)
			if err != nil {
				return out, errors.Join(err, stopAll())
			}
			stops = append(stops, func() error { s(); return nil })
		}
		res := make([]FalseElections, len(o.Modes))
		errs := make([]error, len(o.Modes))
		loadStart := bench.LoadAvg()
		var wg sync.WaitGroup
		for i, mode := range o.Modes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var ws *stallWriters
				var sw *stallWatch
				var fs0 map[int]fsyncHist
				if sc == "stress-disk" {
					ws = startWriters(ctx, cs[mode], leaders[i], StallWriters)
					if mode != ModeEtcd {
						sw = newStallWatch(cs[mode], stalled[i], o.aliveBound(electionTicks))
					}
					fs0 = walFsyncHists(ctx, cs[mode])
				}
				res[i], errs[i] = watchLeaders(ctx, cs[mode], o.FalseElectionDuration, o.UntilChange, sw)
				if ws != nil {
					res[i].Writes, res[i].WriteErrors = ws.stop()
					res[i].Stalled = stalled[i]
				}
				if sw != nil {
					sw.readEvents(ctx, true)
					res[i].Stall = sw.record()
				}
				if fs0 != nil {
					res[i].WALFsync = walFsyncRecord(fs0, walFsyncHists(ctx, cs[mode]), stalled[i])
				}
			}()
		}
		wg.Wait()
		loadEnd := bench.LoadAvg()
		if err := errors.Join(append(errs, stopAll())...); err != nil {
			return out, err
		}
		for _, mode := range o.Modes {
			keepRecords(ctx, cs[mode], sc)
		}
		for i, mode := range o.Modes {
			fe := res[i]
			fe.Offload, fe.Scenario, fe.Nodes, fe.ElectionTicks = mode, sc, o.Nodes, electionTicks
			fe.ElectionTimeoutMs = o.electionMs(mode, electionTicks)
			fe.UntilChange, fe.LoadStart, fe.LoadEnd = o.UntilChange, loadStart, loadEnd
			o.logf("false elections, %s, offload %s, election %d ticks: %d leader changes (term +%d) in %.0fs",
				sc, mode, electionTicks, fe.LeaderChanges, fe.TermIncrease, fe.DurationS)
			out = append(out, fe)
		}
	}
	return out, nil
}

// stallWriters are closed-loop writers to one node, counting what they put.
type stallWriters struct {
	cancel      context.CancelFunc
	wg          sync.WaitGroup
	mu          sync.Mutex
	writes, bad int
}

// startWriters starts n writers putting 64-byte values to node to of c.
func startWriters(ctx context.Context, c *raftlab.Cluster, to, n int) *stallWriters {
	ctx, cancel := context.WithCancel(ctx)
	ws := &stallWriters{cancel: cancel}
	value := strings.Repeat("v", throughputValueBytes)
	for i := range n {
		ws.wg.Add(1)
		go func() {
			defer ws.wg.Done()
			w, err := c.NewWriter([]int{to}, 5*time.Second)
			if err != nil {
				ws.mu.Lock()
				ws.bad++
				ws.mu.Unlock()
				return
			}
			defer w.Close()
			for k := 0; ctx.Err() == nil; k++ {
				wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := w.Put(wctx, fmt.Sprintf("fe/%03d", (i*37+k*7)%throughputKeys), value)
				wcancel()
				ws.mu.Lock()
				if err == nil {
					ws.writes++
				} else if ctx.Err() == nil {
					ws.bad++
				}
				ws.mu.Unlock()
				if err != nil && ctx.Err() == nil {
					time.Sleep(10 * time.Millisecond) // pacing a writer whose writes fail
				}
			}
		}()
	}
	return ws
}

// stop ends the writers and returns the writes acknowledged and failed.
func (ws *stallWriters) stop() (writes, failed int) {
	ws.cancel()
	ws.wg.Wait()
	return ws.writes, ws.bad
}

// keepRecords writes each node's election record (GET /v1/events) and its kedge_raft
// metrics into the cluster's directory as node<id>-<phase>.{events.json,metrics}: what
// explains a leader change (which node campaigned, its detector or etcd-raft's timer, the
// kernel paths' counters). Kept with KEDGE_BENCH_KEEP=1; best effort.
func keepRecords(ctx context.Context, c *raftlab.Cluster, phase string) {
	if c.Spec.Etcd() {
		return // etcd keeps no election record
	}
	cl := raftlab.NewClient(c.Client, 2*time.Second)
	defer cl.Close()
	for _, n := range c.Nodes {
		base := filepath.Join(c.Spec.Dir, fmt.Sprintf("node%d-%s", n.ID, phase))
		if ev, err := cl.Events(ctx, n.ClientAddr.String(), 0); err == nil {
			if b, err := json.MarshalIndent(ev, "", " "); err == nil {
				os.WriteFile(base+".events.json", b, 0o644)
			}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.ClientAddr.String()+"/metrics", nil)
		if err != nil {
			continue
		}
		resp, err := cl.HTTP.Do(req)
		if err != nil {
			continue
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			continue
		}
		var keep []string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "kedge_raft") {
				keep = append(keep, l)
			}
		}
		os.WriteFile(base+".metrics", []byte(strings.Join(keep, "\n")+"\n"), 0o644)
	}
}

// QuietTimeout is, for one mode and false-election phase, the shortest safe election timeout
// found: the shortest election timeout whose run saw no leader change and no term change (0:
// none of those run), and the failover measured at that timeout in the same result (nil: not
// run).
type QuietTimeout struct {
	Offload           string    `json:"offload"`
	Scenario          string    `json:"scenario"`
	DurationS         float64   `json:"duration_s"` // the shortest run at that timeout
	ElectionTimeoutMs float64   `json:"election_timeout_ms"`
	Failover          *Failover `json:"-"`
	Tried             string    `json:"tried"` // every timeout run: "20 ms: 2 changes, 30 ms: 0, ..."
}

// Quiet finds, per mode and phase of r's false-election runs, the shortest quiet timeout.
func Quiet(r *Result) []QuietTimeout {
	var out []QuietTimeout
	idx := map[[2]string]int{}
	for _, fe := range r.FalseElections {
		k := [2]string{fe.Offload, fe.Scenario}
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, QuietTimeout{Offload: fe.Offload, Scenario: fe.Scenario})
		}
		q := &out[i]
		if q.Tried != "" {
			q.Tried += ", "
		}
		q.Tried += fmt.Sprintf("%.0f ms: %d (term +%d)", fe.ElectionTimeoutMs, fe.LeaderChanges, fe.TermIncrease)
		if fe.LeaderChanges == 0 && fe.TermIncrease == 0 && (q.ElectionTimeoutMs == 0 || fe.ElectionTimeoutMs < q.ElectionTimeoutMs) {
			q.ElectionTimeoutMs, q.DurationS = fe.ElectionTimeoutMs, fe.DurationS
		}
	}
	for i := range out {
		q := &out[i]
		for j := range r.Failover {
			if f := &r.Failover[j]; f.Offload == q.Offload && f.ElectionTimeoutMs == q.ElectionTimeoutMs && q.ElectionTimeoutMs > 0 {
				q.Failover = f
			}
		}
	}
	return out
}

// watchLeaders polls every node's status every 20 ms for d and counts new (term, leader)
// pairs. A change shorter than the polling interval can be missed; the term increase
// (elections started, with pre-vote: elections that got a pre-vote quorum) is exact. With
// untilChange it returns at the first change of either. sw (nil: none) gets the leader's
// record of a stalled node from each poll, and reads the nodes' slow saves as it goes.
func watchLeaders(ctx context.Context, c *raftlab.Cluster, d time.Duration, untilChange bool, sw *stallWatch) (FalseElections, error) {
	var fe FalseElections
	type lt struct {
		term   uint64
		leader uint64
	}
	seen := map[lt]bool{}
	var firstTerm, lastTerm uint64
	start := time.Now()
	for time.Since(start) < d && ctx.Err() == nil {
		for _, n := range c.Nodes {
			sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			req := offload.Monotonic()
			st, err := c.Status(sctx, n.ID)
			resp := offload.Monotonic()
			cancel()
			if err != nil {
				continue // a starved node may answer late: its view comes with the next poll
			}
			if sw != nil {
				sw.sample(n.ID, st, req, resp)
			}
			if firstTerm == 0 {
				firstTerm = st.Term
			}
			lastTerm = max(lastTerm, st.Term)
			if st.Leader != 0 {
				seen[lt{st.Term, st.Leader}] = true
			}
		}
		if untilChange && (len(seen) > 1 || lastTerm > firstTerm) {
			break
		}
		if sw != nil {
			sw.readEvents(ctx, false)
		}
		time.Sleep(20 * time.Millisecond) // the polling interval
	}
	fe.DurationS = time.Since(start).Seconds()
	fe.LeaderChanges = max(len(seen)-1, 0)
	fe.TermIncrease = lastTerm - firstTerm
	fe.PerMinute = float64(fe.LeaderChanges) / fe.DurationS * 60
	return fe, ctx.Err()
}
