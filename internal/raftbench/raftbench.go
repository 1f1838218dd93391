// Package raftbench measures kedge raft in a lab cluster (`kedge bench raft`): failover
// time after kill -9 of the leader, leader changes without a crash (false elections) under
// CPU pressure, write throughput and latency, and the follower's CPU per heartbeat - each
// with the kernel paths on and off (`--offload=false`), side by side: the clusters of both
// modes run at the same time and the trials alternate.
package raftbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/raft/api"
	"github.com/kedge-dev/kedge/internal/raft/client"
	"github.com/kedge-dev/kedge/internal/raft/offload"
	"github.com/kedge-dev/kedge/internal/raftlab"
)

// Schema of result.json. Part 2 added fields (offload, heartbeats); a part 1 file (no offload
// field) reads into Result with every run's Offload empty: user space only.
const Schema = "kedge.bench.raft/v1"

// Modes: every kernel path on (asked for explicitly, so that a kernel that cannot run them
// fails the run instead of measuring user space twice: the follower path and the leader's
// kernel heartbeats), the follower path alone (heartbeats and pre-votes answered in XDP,
// the detector; the leader's heartbeats from user space) and off (user space only).
// ModeXDPPass is a control: off, with an XDP program that passes every packet attached to
// each node's interface in the mode the follower program takes there (generic on the lab's
// veths): what attaching XDP costs on these interfaces, apart from what the follower
// program and the node's kernel paths do.
const (
	ModeOn       = "on"
	ModeOnNoWait = "on-nowait"
	ModeFollower = "follower"
	ModeOff      = "off"
	ModeXDPPass  = "xdp-pass"
)

// Modes lists every mode, in the order of the help text. ModeOnNoWait is on without the
// quorum wait (raft serve --quorum-wait=false): what the wait changes.
var Modes = []string{ModeOn, ModeOnNoWait, ModeFollower, ModeOff, ModeXDPPass}

// kernelPaths says whether mode's nodes run the kernel paths.
func kernelPaths(mode string) bool { return kernelHeartbeats(mode) || mode == ModeFollower }

// kernelHeartbeats says whether mode's leader sends its heartbeats from the kernel.
func kernelHeartbeats(mode string) bool { return mode == ModeOn || mode == ModeOnNoWait }

// Failover clients: the one that asks every survivor for the new leader at once (the nodes
// answer as soon as they know one: GET /v1/leader) and writes to it, and part 1's, which
// puts through the survivors in turn with a 50 ms limit per attempt.
const (
	ClientLeader = "leader"
	ClientRetry  = "retry"
)

// modeArgs are the `raft serve` flags of a mode.
func (o *Options) modeArgs(mode string) []string {
	var args []string
	switch mode {
	case ModeOn, ModeOnNoWait:
		args = []string{"--offload", "--kernel-heartbeats", "--quorum-wait=" + strconv.FormatBool(mode == ModeOn)}
		if o.HeartbeatLease > 0 {
			args = append(args, "--heartbeat-lease", o.HeartbeatLease.String())
		}
	case ModeFollower:
		args = []string{"--offload", "--kernel-heartbeats=false"}
	default:
		return []string{"--offload=false", "--kernel-heartbeats=false"}
	}
	if o.OffloadAlive > 0 {
		args = append(args, "--offload-alive", o.OffloadAlive.String())
	}
	return args
}

// Options selects and sizes the runs.
type Options struct {
	Binary string // kedge binary for the nodes
	Dir    string // work directory (cluster data, logs)
	Log    func(format string, args ...any)

	Scenarios      []string      // failover, false-elections, throughput, heartbeat
	Modes          []string      // of Modes: each scenario runs once per mode, side by side
	ClusterKey     string        // 32 hex digits: nodes authenticate every UDP packet ("" none)
	Tick           time.Duration // raft tick (10ms)
	ElectionTicks  []int         // failover and false elections: one setting each (e.g. 5,10,20)
	HeartbeatTicks int           // leader heartbeat interval in ticks (0: the node's default, 1)
	HeartbeatLease time.Duration // ModeOn: the kernel heartbeats' lease (0: the node's default)
	OffloadAlive   time.Duration // ModeOn, ModeFollower: the follower program's alive bound (0: the node's default)
	Nodes          int           // failover and false elections: cluster size (3)

	Trials int // failover trials per setting (>= 50 for the committed figures)
	// FailoverClient: ClientLeader (default) or ClientRetry.
	FailoverClient string
	// FalseElectionDuration is each false-election run's length (per phase and setting).
	FalseElectionDuration time.Duration
	// FalsePhases: idle, spinners (2 per CPU), starved-follower, stress (one spinner per
	// CPU and one follower of each cluster pinned to a CPU shared with three spinners).
	FalsePhases []string
	// FalseModes are the modes of the false-election runs (nil: Modes).
	FalseModes []string
	// HeartbeatDuration is the idle window over which the follower's CPU per heartbeat is taken.
	HeartbeatDuration time.Duration
	// HeartbeatProbes is how many round-trip probes go to one follower per mode (in five
	// rounds, alternating between the modes).
	HeartbeatProbes int

	ThroughputNodes    []int         // (3, 5)
	ThroughputDuration time.Duration // each mode's run in each round
	// ThroughputRounds: rounds of one run per mode, the order alternating (throughput.go).
	ThroughputRounds int
	// Concurrent runs every mode's writers at the same time in each round (each cluster its
	// own Clients writers) instead of one mode after the other: both modes see the same
	// seconds of the machine, so a load that comes and goes falls on both; what a mode
	// costs more shows as fewer writes and more node CPU per write beside the other.
	Concurrent bool
	// BPFStats times the BPF programs during the throughput runs (BPF_ENABLE_STATS, held
	// as a file descriptor: every program on the machine pays two clock reads per run).
	BPFStats bool
	Clients  int // concurrent writers in the throughput run
}

// Result is result.json.
type Result struct {
	bench.Envelope
	Failover       []Failover       `json:"failover,omitempty"`
	FalseElections []FalseElections `json:"false_elections,omitempty"`
	Throughput     []Throughput     `json:"throughput,omitempty"`
	// ThroughputRuns are the throughput scenario's runs, round by round; ThroughputCompare
	// each mode against the baseline (off), paired by round (throughput.go).
	ThroughputRuns    []ThroughputRun     `json:"throughput_runs,omitempty"`
	ThroughputCompare []ThroughputCompare `json:"throughput_compare,omitempty"`
	Heartbeats        []Heartbeats        `json:"heartbeats,omitempty"`
}

// Heartbeats is one idle window on one follower: what its process cost per heartbeat.
type Heartbeats struct {
	Offload   string  `json:"offload"`
	DurationS float64 `json:"duration_s"`
	// Received is the heartbeats that reached the follower: with the kernel path on, those
	// its XDP program answered plus those it passed up; off, those user space received.
	Received  uint64  `json:"received"`
	InXDP     uint64  `json:"answered_in_xdp"`
	ProcCPUMs float64 `json:"process_cpu_ms"` // user + system time of the follower's process
	// LeaderCPUMs is the leader process's user + system time over the window; with kernel
	// heartbeats (ModeOn) PacerPassesPerS is how often its pacer's frames went round
	// (tick_passes + filler_passes: softirq work no process is charged for).
	LeaderCPUMs     float64 `json:"leader_process_cpu_ms"`
	PacerPassesPerS float64 `json:"pacer_passes_per_s"`
	CPUPerHBUs      float64 `json:"process_cpu_per_heartbeat_us"`
	// Round trip of probe heartbeats sent in the leader's name from its namespace (Probe).
	RTTProbes int       `json:"rtt_probes"`
	RTTLost   int       `json:"rtt_lost"` // not answered within 100 ms
	RTTP50Us  float64   `json:"rtt_p50_us"`
	RTTP99Us  float64   `json:"rtt_p99_us"`
	RTTMaxUs  float64   `json:"rtt_max_us"`
	RTTUs     []float64 `json:"rtt_us"`
}

// Failover is one election-timeout setting's trials: kill -9 of the leader until the first
// write acknowledged through a surviving node.
type Failover struct {
	Offload           string    `json:"offload"` // one of Modes
	Nodes             int       `json:"nodes"`
	TickMs            float64   `json:"tick_ms"`
	ElectionTicks     int       `json:"election_ticks"`
	ElectionTimeoutMs float64   `json:"election_timeout_ms"` // etcd-raft randomises in [1x, 2x)
	Trials            int       `json:"trials"`
	FailoverMs        []float64 `json:"failover_ms"` // per trial, in order
	Failed            int       `json:"failed"`      // trials with no successful write within 10 s
	P50Ms             float64   `json:"p50_ms"`
	P99Ms             float64   `json:"p99_ms"`
	MaxMs             float64   `json:"max_ms"`
	Client            string    `json:"client"` // ClientLeader or ClientRetry
	// Phases per acknowledged trial, in order, and their medians/p99 (PhaseNames).
	Phases     []Phase      `json:"phases,omitempty"`
	PhaseStats []PhaseStats `json:"phase_stats,omitempty"`
}

// FalseElections is one run without any crash: leader changes seen while it lasted.
type FalseElections struct {
	Offload           string  `json:"offload"`
	Scenario          string  `json:"scenario"` // idle, spinners (2 per CPU), starved-follower, stress
	Nodes             int     `json:"nodes"`
	ElectionTicks     int     `json:"election_ticks"`
	ElectionTimeoutMs float64 `json:"election_timeout_ms"`
	DurationS         float64 `json:"duration_s"`
	LeaderChanges     int     `json:"leader_changes"` // new (term, leader) pairs after the first
	TermIncrease      uint64  `json:"term_increase"`
	PerMinute         float64 `json:"per_minute"`
}

func (o *Options) logf(format string, args ...any) {
	if o.Log != nil {
		o.Log(format, args...)
	}
}

// Run runs the selected scenarios and returns the result.
func Run(ctx context.Context, o Options) (*Result, error) {
	res := &Result{Envelope: bench.NewEnvelope(ctx, Schema, "", map[string]any{
		"tick_ms": ms(o.Tick), "election_ticks": o.ElectionTicks, "nodes": o.Nodes, "trials": o.Trials,
		"false_election_s": o.FalseElectionDuration.Seconds(), "throughput_nodes": o.ThroughputNodes,
		"throughput_s": o.ThroughputDuration.Seconds(), "throughput_rounds": o.ThroughputRounds, "throughput_concurrent": o.Concurrent, "bpf_stats": o.BPFStats, "clients": o.Clients, "scenarios": o.Scenarios,
		"modes": o.Modes, "false_modes": o.FalseModes, "false_phases": o.FalsePhases, "failover_client": o.failoverClient(),
		"heartbeat_ticks": o.HeartbeatTicks, "heartbeat_lease_ms": ms(o.HeartbeatLease), "offload_alive_ms": ms(o.OffloadAlive), "heartbeat_s": o.HeartbeatDuration.Seconds(),
		"authenticated": o.ClusterKey != "",
	})}
	for _, sc := range o.Scenarios {
		var err error
		switch sc {
		case "failover":
			for _, et := range o.ElectionTicks {
				var f []Failover
				f, err = o.failover(ctx, et)
				res.Failover = append(res.Failover, f...)
				if err != nil {
					break
				}
			}
		case "false-elections":
			for _, et := range o.ElectionTicks {
				var fe []FalseElections
				fe, err = o.falseElections(ctx, et)
				res.FalseElections = append(res.FalseElections, fe...)
				if err != nil {
					break
				}
			}
		case "throughput":
			for _, n := range o.ThroughputNodes {
				var runs []ThroughputRun
				runs, err = o.throughput(ctx, n)
				res.ThroughputRuns = append(res.ThroughputRuns, runs...)
				if err != nil {
					break
				}
			}
			res.Throughput = poolThroughput(res.ThroughputRuns, o.Modes)
			res.ThroughputCompare = CompareThroughput(res.ThroughputRuns, o.Modes)
		case "heartbeat":
			var hb []Heartbeats
			hb, err = o.heartbeats(ctx)
			res.Heartbeats = append(res.Heartbeats, hb...)
		default:
			err = fmt.Errorf("unknown scenario %q: use failover, false-elections, throughput or heartbeat", sc)
		}
		if err != nil {
			return res, fmt.Errorf("scenario %s: %w", sc, err)
		}
	}
	return res, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (o *Options) cluster(ctx context.Context, name string, nodes, electionTicks int, mode string) (*raftlab.Cluster, error) {
	name += mode
	dir := filepath.Join(o.Dir, name)
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	uctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	spec := raftlab.Spec{Name: name, Nodes: nodes, Binary: o.Binary, Dir: dir,
		Tick: o.Tick, ElectionTicks: electionTicks, HeartbeatTicks: o.HeartbeatTicks, Args: o.modeArgs(mode), ClusterKey: o.ClusterKey}
	c, err := raftlab.Up(uctx, spec)
	for try := 2; err != nil && try <= startTries && uctx.Err() == nil; try++ {
		// A node that cannot start its kernel paths exits (mode on asks for them explicitly);
		// the pacer's calibration fails now and then on a loaded machine: try again.
		o.logf("cluster %s (offload %s) did not come up (%v); attempt %d of %d", name, mode, err, try, startTries)
		if err = os.RemoveAll(dir); err == nil {
			c, err = raftlab.Up(uctx, spec)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("cluster %s (offload %s): %w", name, mode, err)
	}
	for _, n := range c.Nodes {
		st, err := c.Status(uctx, n.ID)
		if err == nil && (st.Offload != "") != kernelPaths(mode) {
			err = fmt.Errorf("node %d reports offload %q", n.ID, st.Offload)
		}
		if err != nil {
			return nil, errors.Join(fmt.Errorf("cluster %s (offload %s): %w", name, mode, err), c.Close())
		}
	}
	if mode == ModeXDPPass {
		if err := attachPass(c); err != nil {
			return nil, errors.Join(fmt.Errorf("cluster %s (offload %s): %w", name, mode, err), c.Close())
		}
	}
	return c, nil
}

// attachPass attaches an XDP_PASS program to every node's interface of c, generic (skb)
// mode as the follower program takes on a veth (internal/raft/offload); detached when c
// closes (or when this process dies: the bench holds the links).
func attachPass(c *raftlab.Cluster) error {
	for _, n := range c.Nodes {
		ifindex, err := bpfx.IfIndex(n.Host.Handle, n.Host.Iface)
		if err != nil {
			return err
		}
		a, err := bpfx.AttachXDPPassMode(n.Host.Handle, ifindex, bpfx.XDPGeneric)
		if err != nil {
			return fmt.Errorf("node %d: %w", n.ID, err)
		}
		c.OnClose(a.Close)
	}
	return nil
}

// clusters starts one cluster per mode; on error the ones already up are closed.
func (o *Options) clusters(ctx context.Context, name string, nodes, electionTicks int) (map[string]*raftlab.Cluster, func() error, error) {
	cs := map[string]*raftlab.Cluster{}
	closeAll := func() error {
		var errs []error
		for _, c := range cs {
			errs = append(errs, c.Close())
		}
		return errors.Join(errs...)
	}
	for _, mode := range o.Modes {
		c, err := o.cluster(ctx, name, nodes, electionTicks, mode)
		if err != nil {
			return nil, nil, errors.Join(err, closeAll())
		}
		cs[mode] = c
	}
	return cs, closeAll, nil
}

// stableLeader waits until every running node names the same leader and has applied
// what the leader committed.
func stableLeader(ctx context.Context, c *raftlab.Cluster) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for {
		var leader int
		var commit uint64
		ok := true
		for _, n := range c.Nodes {
			st, err := c.Status(ctx, n.ID)
			if err != nil {
				ok = false
				break
			}
			if st.State == "leader" {
				leader, commit = int(st.ID), st.Commit
			}
		}
		if ok && leader != 0 {
			for _, n := range c.Nodes {
				st, err := c.Status(ctx, n.ID)
				if err != nil || int(st.Leader) != leader || st.Applied < commit {
					ok = false
				}
			}
			if ok {
				return leader, nil
			}
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("cluster not stable: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond): // polling the cluster's state
		}
	}
}

// failover runs o.Trials kill -9 trials with one election timeout in each mode: the
// clusters of all modes are up together and the trials alternate between them.
func (o *Options) failover(ctx context.Context, electionTicks int) (out []Failover, err error) {
	cs, closeAll, err := o.clusters(ctx, fmt.Sprintf("rbf%d", electionTicks), o.Nodes, electionTicks)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, closeAll()) }()
	fs := map[string]*Failover{}
	for _, mode := range o.Modes {
		fs[mode] = &Failover{Offload: mode, Nodes: o.Nodes, TickMs: ms(o.Tick), ElectionTicks: electionTicks,
			ElectionTimeoutMs: ms(o.Tick) * float64(electionTicks), Trials: o.Trials, Client: o.failoverClient()}
	}
	for trial := 0; trial < o.Trials; trial++ {
		for _, mode := range o.Modes {
			if err = o.failoverTrial(ctx, cs[mode], fs[mode], trial); err != nil {
				return collect(fs, o.Modes), fmt.Errorf("offload %s: %w", mode, err)
			}
		}
		if trial%10 == 9 {
			o.logf("failover, election %d ticks: %d/%d trials per mode", electionTicks, trial+1, o.Trials)
		}
	}
	return collect(fs, o.Modes), nil
}

func (o *Options) failoverClient() string {
	if o.FailoverClient == "" {
		return ClientLeader
	}
	return o.FailoverClient
}

func collect(fs map[string]*Failover, modes []string) []Failover {
	var out []Failover
	for _, mode := range modes {
		f := fs[mode]
		s := slices.Clone(f.FailoverMs)
		slices.Sort(s)
		if len(s) > 0 {
			f.P50Ms, f.P99Ms, f.MaxMs = bench.Percentile(s, 50), bench.Percentile(s, 99), s[len(s)-1]
		}
		f.PhaseStats = phaseStats(f.Phases)
		out = append(out, *f)
	}
	return out
}

// failoverTrial kills c's leader and times the first write acknowledged by a survivor, then
// splits that time into phases from the survivors' election records (GET /v1/events: the
// nodes and this process share CLOCK_MONOTONIC).
func (o *Options) failoverTrial(ctx context.Context, c *raftlab.Cluster, f *Failover, trial int) error {
	cl := raftlab.NewClient(c.Client, 5*time.Second)
	defer cl.Close()
	leader, err := stableLeader(ctx, c)
	if err != nil {
		return err
	}
	st, err := c.Status(ctx, leader)
	if err != nil {
		return err
	}
	var survivors []int
	for _, n := range c.Nodes {
		if n.ID != leader {
			survivors = append(survivors, n.ID)
		}
	}
	// One write through a survivor before the kill: the path works (and the connections
	// from the client host are open, as a running client's would be).
	if w := firstWriteRetry(ctx, c, cl, survivors, fmt.Sprintf("pre%d", trial), 5*time.Second); w.ackNs == 0 {
		return errors.New("no write succeeded before the kill")
	}
	// The client starts with the SIGKILL: Kill also waits for the exit and removes what
	// the dead node left (its pacer's namespace, tens of ms), which no client waits for.
	killed := make(chan error, 1)
	killNs := int64(offload.Monotonic())
	go func() { killed <- c.Kill(leader) }()
	key := fmt.Sprintf("post%d", trial)
	var w written
	if o.failoverClient() == ClientRetry {
		w = firstWriteRetry(ctx, c, cl, survivors, key, 10*time.Second)
	} else {
		w = firstWriteLeader(ctx, c, cl, survivors, st.Term, key, 10*time.Second)
	}
	if err := <-killed; err != nil {
		return err
	}
	if w.ackNs == 0 {
		f.Failed++
	} else {
		f.FailoverMs = append(f.FailoverMs, float64(w.ackNs-killNs)/1e6)
		ph, err := phases(ctx, c, cl, survivors, st.Term, killNs, w)
		if err != nil {
			return err
		}
		f.Phases = append(f.Phases, ph)
	}
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	return o.restart(rctx, c, leader)
}

// startTries bounds the attempts to start a cluster or restart a node.
const startTries = 3

// restart starts node id again and waits until it answers; a node that exits at start (its
// kernel paths could not start) is started again, up to startTries times in all.
func (o *Options) restart(ctx context.Context, c *raftlab.Cluster, id int) error {
	var err error
	for try := 1; try <= startTries; try++ {
		if err = c.Start(id); err != nil {
			return err
		}
		if err = c.WaitReady(ctx, id); err == nil || ctx.Err() != nil || c.Running(id) {
			return err
		}
		o.logf("node %d exited at start (%v); attempt %d of %d", id, err, try+1, startTries)
		if kerr := c.Kill(id); kerr != nil { // forget the exited process, remove what it left
			return errors.Join(err, kerr)
		}
	}
	return err
}

// written is what the failover client saw (CLOCK_MONOTONIC ns; ackNs 0: no write acknowledged).
type written struct {
	foundNs, ackNs int64
	attempts       int
}

// firstWriteLeader asks every survivor at once for a leader of a term above oldTerm (each
// answers as soon as it knows one) and puts key to it; a failed put asks again.
func firstWriteLeader(ctx context.Context, c *raftlab.Cluster, cl *client.Client, via []int, oldTerm uint64, key string, limit time.Duration) written {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	all := &client.Client{HTTP: cl.HTTP}
	for _, id := range via {
		all.Endpoints = append(all.Endpoints, c.Node(id).ClientAddr.String())
	}
	var w written
	for i := 0; ctx.Err() == nil; i++ {
		l, err := all.LeaderAfter(ctx, oldTerm)
		if err != nil {
			return written{}
		}
		if w.foundNs == 0 {
			w.foundNs = int64(offload.Monotonic())
		}
		w.attempts++
		actx, acancel := context.WithTimeout(ctx, time.Second)
		_, err = cl.At(l.Client).Put(actx, "bench/"+key, fmt.Sprint(i))
		acancel()
		if err == nil {
			w.ackNs = int64(offload.Monotonic())
			return w
		}
	}
	return written{}
}

// firstWriteRetry puts key through the survivors in turn (50 ms per attempt) until one is
// acknowledged (part 1's client).
func firstWriteRetry(ctx context.Context, c *raftlab.Cluster, cl *client.Client, via []int, key string, limit time.Duration) written {
	start := time.Now()
	var w written
	for i := 0; time.Since(start) < limit && ctx.Err() == nil; i++ {
		op := raftlab.Op{Kind: raftlab.Put, Key: "bench/" + key, Value: fmt.Sprint(i)}
		actx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		raftlab.Do(actx, cl, c.Node(via[i%len(via)]).ClientAddr, &op)
		cancel()
		w.attempts++
		if op.Out.Err == "" && !op.Out.Unknown {
			w.ackNs = int64(offload.Monotonic())
			return w
		}
		if !op.Out.Unknown { // refused at once (no leader yet): do not spin on it
			time.Sleep(time.Millisecond) // pacing retries against a refusing node
		}
	}
	return written{}
}

// Phase is one failover trial split at the events of the survivors' election records, in
// ms after the kill (-1: not seen). Detect is the first survivor that noticed the silence:
// the kernel's detector waking it (Source "kernel") or etcd-raft's own timer starting a
// pre-vote ("etcd-raft").
type Phase struct {
	TotalMs    float64 `json:"total_ms"`
	HeardAgeMs float64 `json:"heard_age_ms"` // how old the first detector's last message from the leader was at the kill
	DetectMs   float64 `json:"detect_ms"`
	Source     string  `json:"source"`
	// PreCandidateMs: the first detector's node started its pre-vote (its user space woke
	// on the kernel's event and ran Campaign; = DetectMs when etcd-raft's timer fired).
	PreCandidateMs float64 `json:"pre_candidate_ms"`
	CandidateMs    float64 `json:"candidate_ms"` // the winner's pre-vote quorum (its new term durable)
	TermSaveMs     float64 `json:"term_save_ms"` // of which saving its new term and own vote (fsync)
	LeaderMs       float64 `json:"leader_ms"`    // the winner's vote quorum
	CommitMs       float64 `json:"commit_ms"`    // the winner's first entry committed
	FoundMs        float64 `json:"found_ms"`     // the client knew the new leader (leader client)
	AckMs          float64 `json:"ack_ms"`       // the client's write acknowledged
	Terms          uint64  `json:"terms"`        // term increase (> 1: more than one election)
	Attempts       int     `json:"attempts"`     // client writes sent
}

// phases reads the survivors' election records since the kill and places the trial's events.
func phases(ctx context.Context, c *raftlab.Cluster, cl *client.Client, survivors []int, oldTerm uint64, killNs int64, w written) (Phase, error) {
	at := func(ns int64) float64 {
		if ns == 0 {
			return -1
		}
		return float64(ns-killNs) / 1e6
	}
	var detect, heard, cand, lead, commit, precand, save int64
	var source string
	var detector int
	var term uint64
	var winner uint64
	evs := map[int][]api.Event{}
	for _, id := range survivors {
		r, err := cl.Events(ctx, c.Node(id).ClientAddr.String(), killNs)
		if err != nil {
			return Phase{}, fmt.Errorf("events of node %d: %w", id, err)
		}
		evs[id] = r.Events
		for _, e := range r.Events {
			if (e.Kind == api.EventDetector && e.Detail == "campaign") || e.Kind == api.EventPreCandidate {
				if detect == 0 || e.AtNs < detect {
					detect, source, heard, detector = e.AtNs, "etcd-raft", e.HeardNs, id
					if e.Kind == api.EventDetector {
						source = "kernel"
					}
				}
			}
			if e.Kind == api.EventLeader && e.Term > term {
				term, winner = e.Term, uint64(id)
			}
		}
	}
	for _, e := range evs[detector] {
		if e.Kind == api.EventPreCandidate && e.AtNs >= detect {
			precand = e.AtNs
			break
		}
	}
	for _, e := range evs[int(winner)] {
		switch {
		case e.Kind == api.EventCandidate && e.Term == term:
			cand, save = e.AtNs, e.SaveNs
		case e.Kind == api.EventLeader && e.Term == term:
			lead = e.AtNs
		case e.Kind == api.EventCommitted && e.Term == term:
			commit = e.AtNs
		}
	}
	p := Phase{TotalMs: at(w.ackNs), DetectMs: at(detect), Source: source, PreCandidateMs: at(precand),
		CandidateMs: at(cand), TermSaveMs: float64(save) / 1e6, LeaderMs: at(lead),
		CommitMs: at(commit), FoundMs: at(w.foundNs), AckMs: at(w.ackNs), Attempts: w.attempts, HeardAgeMs: -1}
	if heard != 0 {
		p.HeardAgeMs = float64(killNs-heard) / 1e6
	}
	if term > oldTerm {
		p.Terms = term - oldTerm
	}
	return p, nil
}

// PhaseStats are the medians and 99th percentiles of a setting's phases, each as the time
// from the previous event (the last heartbeat's age at the kill stands apart).
type PhaseStats struct {
	Name  string  `json:"name"`
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
	N     int     `json:"n"`
}

// PhaseNames in order: kill -> detect -> wake (the detecting node's pre-vote started) ->
// pre-vote (the winner's pre-vote quorum, before its term fsync) -> term-fsync (its new term
// and own vote saved: a candidate) -> vote (its vote quorum: a leader) -> commit (the leader's
// first entry) -> client (the client's write acknowledged).
var PhaseNames = []string{"heard-age", "detect", "wake", "pre-vote", "term-fsync", "vote", "commit", "client"}

func phaseStats(ps []Phase) []PhaseStats {
	vals := make([][]float64, len(PhaseNames))
	for _, p := range ps {
		// Records without the wake split (pre_candidate_ms -1, or older records: 0) put the
		// whole of detect -> candidate under pre-vote.
		pre := p.PreCandidateMs
		if pre < p.DetectMs || pre > p.CandidateMs {
			pre = p.DetectMs
		}
		quorum := p.CandidateMs - p.TermSaveMs
		steps := []float64{p.HeardAgeMs, p.DetectMs, pre - p.DetectMs, quorum - pre, p.TermSaveMs, p.LeaderMs - p.CandidateMs,
			p.CommitMs - p.LeaderMs, p.AckMs - p.CommitMs}
		ok := []bool{p.HeardAgeMs >= 0, p.DetectMs >= 0, p.CandidateMs >= 0 && p.DetectMs >= 0, p.CandidateMs >= 0 && p.DetectMs >= 0,
			p.CandidateMs >= 0, p.LeaderMs >= 0 && p.CandidateMs >= 0, p.CommitMs >= 0 && p.LeaderMs >= 0, p.AckMs >= 0 && p.CommitMs >= 0}
		for i := range steps {
			if ok[i] {
				vals[i] = append(vals[i], steps[i])
			}
		}
	}
	var out []PhaseStats
	for i, name := range PhaseNames {
		s := slices.Clone(vals[i])
		slices.Sort(s)
		st := PhaseStats{Name: name, N: len(s)}
		if len(s) > 0 {
			st.P50Ms, st.P99Ms = bench.Percentile(s, 50), bench.Percentile(s, 99)
		}
		out = append(out, st)
	}
	return out
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
		for _, mode := range o.Modes {
			leader, err := stableLeader(ctx, cs[mode])
			if err != nil {
				return out, errors.Join(err, stopAll())
			}
			if sc != "starved-follower" && sc != "stress" {
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
		}
		switch sc {
		case "spinners", "stress":
			n := 2 * runtime.NumCPU()
			if sc == "stress" {
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
		var wg sync.WaitGroup
		for i, mode := range o.Modes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res[i], errs[i] = watchLeaders(ctx, cs[mode], o.FalseElectionDuration)
			}()
		}
		wg.Wait()
		if err := errors.Join(append(errs, stopAll())...); err != nil {
			return out, err
		}
		for _, mode := range o.Modes {
			keepRecords(ctx, cs[mode], sc)
		}
		for i, mode := range o.Modes {
			fe := res[i]
			fe.Offload, fe.Scenario, fe.Nodes, fe.ElectionTicks = mode, sc, o.Nodes, electionTicks
			fe.ElectionTimeoutMs = ms(o.Tick) * float64(electionTicks)
			o.logf("false elections, %s, offload %s, election %d ticks: %d leader changes (term +%d) in %.0fs",
				sc, mode, electionTicks, fe.LeaderChanges, fe.TermIncrease, fe.DurationS)
			out = append(out, fe)
		}
	}
	return out, nil
}

// keepRecords writes each node's election record (GET /v1/events) and its kedge_raft
// metrics into the cluster's directory as node<id>-<phase>.{events.json,metrics}: what
// explains a leader change (which node campaigned, its detector or etcd-raft's timer, the
// kernel paths' counters). Kept with KEDGE_BENCH_KEEP=1; best effort.
func keepRecords(ctx context.Context, c *raftlab.Cluster, phase string) {
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

// QuietTimeout answers the question for one mode and false-election phase: the
// shortest election timeout whose run saw no leader change and no term change (0: none of
// those run), and the failover measured at that timeout in the same result (nil: not run).
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
// (elections started, with pre-vote: elections that got a pre-vote quorum) is exact.
func watchLeaders(ctx context.Context, c *raftlab.Cluster, d time.Duration) (FalseElections, error) {
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
			st, err := c.Status(sctx, n.ID)
			cancel()
			if err != nil {
				continue // a starved node may answer late: its view comes with the next poll
			}
			if firstTerm == 0 {
				firstTerm = st.Term
			}
			lastTerm = max(lastTerm, st.Term)
			if st.Leader != 0 {
				seen[lt{st.Term, st.Leader}] = true
			}
		}
		time.Sleep(20 * time.Millisecond) // the polling interval
	}
	fe.DurationS = time.Since(start).Seconds()
	fe.LeaderChanges = max(len(seen)-1, 0)
	fe.TermIncrease = lastTerm - firstTerm
	fe.PerMinute = float64(fe.LeaderChanges) / fe.DurationS * 60
	return fe, ctx.Err()
}

// WriteCharts draws the failover CDF (one line per election timeout) and the write latency
// CDF (one per cluster size) next to result.json.
func WriteCharts(dir string, r *Result) error {
	var errs []error
	if len(r.Failover) > 0 {
		var ss []bench.Series
		for _, f := range r.Failover {
			ss = append(ss, series(fmt.Sprintf("offload %s, election timeout %.0f ms", f.Offload, f.ElectionTimeoutMs), f.FailoverMs, 1000))
		}
		errs = append(errs, bench.WriteCDF(filepath.Join(dir, "failover"), ss, bench.ChartOptions{
			Title: "failover: kill -9 of the leader -> first acknowledged write"}))
	}
	if len(r.Throughput) > 0 {
		var ss []bench.Series
		for _, t := range r.Throughput {
			ss = append(ss, series(fmt.Sprintf("offload %s, %d nodes, %d clients", t.Offload, t.Nodes, t.Clients), t.LatenciesUS, 1))
		}
		errs = append(errs, bench.WriteCDF(filepath.Join(dir, "write-latency"), ss, bench.ChartOptions{Title: "write latency (put to the leader)"}))
	}
	return errors.Join(errs...)
}

// series turns values (scaled to microseconds) into a chart series.
func series(name string, vals []float64, toUS float64) bench.Series {
	s := bench.Series{Name: name}
	for i, v := range vals {
		s.IDs = append(s.IDs, uint32(i))
		s.LatenciesUS = append(s.LatenciesUS, math.Max(v*toUS, 1))
		s.OK = append(s.OK, true)
	}
	return s
}

// heartbeats leaves the clusters of both modes idle for o.HeartbeatDuration and takes, on
// one follower of each, the CPU time of its process and the heartbeats that reached it;
// then it measures that follower's heartbeat round trip with probes (Probe). The clusters
// have no key: the probe speaks in the leader's name and cannot sign.
func (o *Options) heartbeats(ctx context.Context) (out []Heartbeats, err error) {
	unkeyed := *o
	unkeyed.ClusterKey = ""
	// An idle window without elections: at least the node's default 100 ms election timeout
	// (10 ticks of 10 ms; more ticks of a shorter --tick).
	cs, closeAll, err := unkeyed.clusters(ctx, "rbh", o.Nodes, max(10, int(100*time.Millisecond/o.Tick)))
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, closeAll()) }()
	type sample struct {
		cpu, leaderCPU   time.Duration
		hb, xdp, passes  uint64
		follower, leader int
	}
	read := func(mode string, c *raftlab.Cluster, follower, leader int) (sample, error) {
		s := sample{follower: follower, leader: leader}
		var err error
		if s.cpu, err = bench.ProcCPU(c.PID(follower)); err != nil {
			return s, err
		}
		if s.leaderCPU, err = bench.ProcCPU(c.PID(leader)); err != nil {
			return s, err
		}
		if kernelHeartbeats(mode) { // the conveyor's passes: what kernel heartbeats cost
			cl := raftlab.NewClient(c.Client, 2*time.Second)
			v, err := cl.Metric(ctx, c.Node(leader).ClientAddr.String(), "kedge_raft_heartbeat_pacer_total", `counter="tick_passes"`)
			w, werr := cl.Metric(ctx, c.Node(leader).ClientAddr.String(), "kedge_raft_heartbeat_pacer_total", `counter="filler_passes"`)
			cl.Close()
			if err = errors.Join(err, werr); err != nil {
				return s, err
			}
			s.passes = uint64(v + w)
		}
		if kernelPaths(mode) {
			n := c.Node(follower)
			in, err := offload.Inspect(n.Host.Handle, n.Host.Iface)
			if err != nil {
				return s, err
			}
			s.xdp = in.Counters["hb_answered"]
			for k, v := range in.Counters {
				if strings.HasPrefix(k, "hb_") {
					s.hb += v
				}
			}
			return s, nil
		}
		cl := raftlab.NewClient(c.Client, 2*time.Second)
		defer cl.Close()
		v, err := cl.Metric(ctx, c.Node(follower).ClientAddr.String(), "kedge_raft_transport_received_total", `type="MsgHeartbeat"`)
		s.hb = uint64(v)
		return s, err
	}
	before := map[string]sample{}
	for _, mode := range o.Modes {
		leader, err := stableLeader(ctx, cs[mode])
		if err != nil {
			return nil, err
		}
		follower := leader%o.Nodes + 1
		if before[mode], err = read(mode, cs[mode], follower, leader); err != nil {
			return nil, fmt.Errorf("offload %s: %w", mode, err)
		}
	}
	start := time.Now()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(o.HeartbeatDuration): // the measured idle window
	}
	d := time.Since(start)
	for _, mode := range o.Modes {
		b := before[mode]
		a, err := read(mode, cs[mode], b.follower, b.leader)
		if err != nil {
			return out, fmt.Errorf("offload %s: %w", mode, err)
		}
		h := Heartbeats{Offload: mode, DurationS: d.Seconds(), Received: a.hb - b.hb, InXDP: a.xdp - b.xdp,
			ProcCPUMs: ms(a.cpu - b.cpu), LeaderCPUMs: ms(a.leaderCPU - b.leaderCPU),
			PacerPassesPerS: float64(a.passes-b.passes) / d.Seconds()}
		if h.Received > 0 {
			h.CPUPerHBUs = float64((a.cpu - b.cpu).Microseconds()) / float64(h.Received)
		}
		out = append(out, h)
	}
	const rounds = 5
	for r := range rounds {
		for i, mode := range o.Modes {
			rtts, lost, err := o.probe(ctx, cs[mode], before[mode].follower, max(o.HeartbeatProbes/rounds, 1))
			if err != nil {
				return out, fmt.Errorf("offload %s: heartbeat probe round %d: %w", mode, r, err)
			}
			out[i].RTTUs = append(out[i].RTTUs, rtts...)
			out[i].RTTLost += lost
			out[i].RTTProbes += len(rtts) + lost
		}
	}
	for i := range out {
		h := &out[i]
		s := slices.Clone(h.RTTUs)
		slices.Sort(s)
		if len(s) > 0 {
			h.RTTP50Us, h.RTTP99Us, h.RTTMaxUs = bench.Percentile(s, 50), bench.Percentile(s, 99), s[len(s)-1]
		}
		o.logf("heartbeats, offload %s: %d in %.0fs (%d answered in XDP), follower process %.1f ms CPU, %.1f us per heartbeat, leader process %.1f ms CPU, pacer %.0f passes/s; round trip p50 %.0f us p99 %.0f us (%d probes, %d lost)",
			h.Offload, h.Received, h.DurationS, h.InXDP, h.ProcCPUMs, h.CPUPerHBUs, h.LeaderCPUMs, h.PacerPassesPerS, h.RTTP50Us, h.RTTP99Us, h.RTTProbes, h.RTTLost)
	}
	return out, nil
}

// probe runs `kedge bench raft-hbprobe` in the leader's namespace against follower.
func (o *Options) probe(ctx context.Context, c *raftlab.Cluster, follower, count int) ([]float64, int, error) {
	leader, err := stableLeader(ctx, c)
	if err != nil {
		return nil, 0, err
	}
	if leader == follower {
		return nil, 0, fmt.Errorf("node %d, the measured follower, became the leader", follower)
	}
	st, err := c.Status(ctx, leader)
	if err != nil {
		return nil, 0, err
	}
	h := c.Node(leader).Host
	cmd := h.Command(o.Binary, "bench", "raft-hbprobe", "--cluster", fmt.Sprint(raftlab.ClusterID),
		"--leader", fmt.Sprint(leader), "--follower", fmt.Sprint(follower), "--term", fmt.Sprint(st.Term),
		"--from", c.Node(leader).RaftAddr.String(), "--to", c.Node(follower).RaftAddr.String(),
		"--count", fmt.Sprint(count))
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := h.Start(cmd); err != nil {
		return nil, 0, err
	}
	if err := cmd.Wait(); err != nil {
		return nil, 0, fmt.Errorf("%w: %s", err, stderr.String())
	}
	var res ProbeResult
	if err := json.Unmarshal([]byte(stdout.String()), &res); err != nil {
		return nil, 0, fmt.Errorf("heartbeat probe output %q: %w", stdout.String(), err)
	}
	return res.RTTUs, res.Lost, nil
}

// ProbeResult is what `kedge bench raft-hbprobe` prints (JSON).
type ProbeResult struct {
	RTTUs []float64 `json:"rtt_us"`
	Lost  int       `json:"lost"`
}
