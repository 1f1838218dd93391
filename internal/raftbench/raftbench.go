// Package raftbench measures kedge raft in a lab cluster (`kedge bench raft`): failover
// time after kill -9 of the leader, leader changes without a crash (false elections) under
// CPU pressure, write throughput and latency, and the follower's CPU per heartbeat - each
// with the kernel paths on and off (`--offload=false`), side by side: the clusters of both
// modes run at the same time and the trials alternate.
package raftbench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/raft/offload"
	"github.com/kedge-dev/kedge/internal/raftlab"
)

// Schema of result.json. Fields added since v1 are optional: an older file (no offload field)
// reads into Result with every run's Offload empty (user space only), no routing (to the
// leader) and no peer.
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
	// ModeOnNoClose is on without the closed-connection failover (raft serve
	// --close-failover=false): survivors wait for the election timeout as before.
	ModeOnNoClose = "on-noclose"
	ModeFollower  = "follower"
	ModeOff       = "off"
	ModeXDPPass   = "xdp-pass"
	// ModeEtcd is the peer: the same lab running etcd (raftlab.ServerEtcd) instead of kedge,
	// written to by etcd's own Go client. When it runs it is the baseline of every ratio.
	ModeEtcd = "etcd"
)

// Modes lists every mode, in the order of the help text. ModeOnNoWait is on without the
// quorum wait (raft serve --quorum-wait=false): what the wait changes.
var Modes = []string{ModeOn, ModeOnNoWait, ModeOnNoClose, ModeFollower, ModeOff, ModeXDPPass, ModeEtcd}

// Routings of the throughput writers: every request to the leader, or spread over every
// node in turn (as etcd's client balances; a follower forwards the write to the leader).
const (
	RouteLeader = "leader"
	RouteSpread = "spread"
)

// kernelPaths says whether mode's nodes run the kernel paths.
func kernelPaths(mode string) bool { return kernelHeartbeats(mode) || mode == ModeFollower }

// kernelHeartbeats says whether mode's leader sends its heartbeats from the kernel.
func kernelHeartbeats(mode string) bool {
	return mode == ModeOn || mode == ModeOnNoWait || mode == ModeOnNoClose
}

// Failover clients: the one that asks every survivor for the new leader at once (the nodes
// answer as soon as they know one: GET /v1/leader) and writes to it, and the one that
// puts through the survivors in turn with a 50 ms limit per attempt. Both are told which
// node died.
//
// ClientUninformed is not told which node died: it knows every node and the leader (and
// its term) it last wrote to, writes there and finds out as an application's client would
// - a refused or reset connection, or no answer within FailoverAttempt -, then asks every
// node for the leader of a newer term (kedge: GET /v1/leader) and writes to it. etcd's
// client in that case has all the nodes as endpoints and puts through its balancer (it
// leaves a node whose connection failed, a follower forwards the write to the leader);
// when that fails it asks the nodes' Maintenance.Status for a newer leader. A write sent
// once a new leader is known is waited for (at most a second), in both systems.
const (
	ClientLeader     = "leader"
	ClientRetry      = "retry"
	ClientUninformed = "uninformed"
)

// FailoverClients lists the failover clients.
var FailoverClients = []string{ClientLeader, ClientRetry, ClientUninformed}

// electionMs is mode's election timeout in ms with electionTicks of o.Tick: etcd's is
// whole milliseconds, at least 5 (raftlab.EtcdTiming).
func (o *Options) electionMs(mode string, electionTicks int) float64 {
	if mode == ModeEtcd {
		_, el := raftlab.EtcdTiming(o.Tick, electionTicks)
		return float64(el)
	}
	return ms(o.Tick) * float64(electionTicks)
}

// aliveBound is the follower program's alive bound of kedge's nodes at electionTicks:
// --offload-alive, else the nodes' default (offload.DefaultBound of the election timeout).
func (o *Options) aliveBound(electionTicks int) time.Duration {
	if o.OffloadAlive > 0 {
		return o.OffloadAlive
	}
	return offload.DefaultBound(time.Duration(electionTicks) * o.Tick)
}

// modeArgs are the `raft serve` flags of a mode.
func (o *Options) modeArgs(mode string) []string {
	var args []string
	switch mode {
	case ModeOn, ModeOnNoWait, ModeOnNoClose:
		args = []string{"--offload", "--kernel-heartbeats", "--quorum-wait=" + strconv.FormatBool(mode != ModeOnNoWait),
			"--close-failover=" + strconv.FormatBool(mode != ModeOnNoClose)}
		if o.HeartbeatLease > 0 {
			args = append(args, "--heartbeat-lease", o.HeartbeatLease.String())
		}
	case ModeFollower:
		args = []string{"--offload", "--kernel-heartbeats=false"}
	case ModeEtcd:
		return nil // etcd's flags: raftlab's etcd.go
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
	// FailoverClients: of FailoverClients (nil: ClientLeader); the trials alternate
	// between them.
	FailoverClients []string
	// FailoverBlock > 0 runs the failover in blocks of that many trials per client: one
	// mode's cluster up at a time, started for its block and stopped after it, the modes
	// alternating block by block (failoverBlocks). 0: every mode's cluster up at once, the
	// trials alternating one by one.
	FailoverBlock int
	// FailoverAttempt bounds the uninformed failover clients' write to the leader they
	// knew, before they look for a new one (0: the election timeout, at least 10 ms).
	FailoverAttempt time.Duration
	// StallIOPS: the stress-disk phase's limit on the stalled node's disk writes per
	// second (0: raftlab.StallIOPS).
	StallIOPS int
	// FalseElectionDuration is each false-election run's length (per phase and setting).
	FalseElectionDuration time.Duration
	// FalsePhases: idle, spinners (2 per CPU), starved-follower, stress (one spinner per
	// CPU and one follower of each cluster pinned to a CPU shared with three spinners),
	// stress-disk (stress, and the other follower's disk stalled while StallWriters write).
	FalsePhases []string
	// FalseModes are the modes of the false-election runs (nil: Modes).
	FalseModes []string
	// UntilChange ends each mode's false-election run at its first leader or term change
	// (a shortest-safe-timeout search: a run that saw one is unsafe at that timeout).
	UntilChange bool
	// HeartbeatDuration is the idle window over which the follower's CPU per heartbeat is taken.
	HeartbeatDuration time.Duration
	// HeartbeatProbes is how many round-trip probes go to one follower per mode (in five
	// rounds, alternating between the modes).
	HeartbeatProbes int

	ThroughputNodes []int // (3, 5)
	// ThroughputRoutings: RouteLeader, RouteSpread (nil: RouteLeader).
	ThroughputRoutings []string
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
	Failover []Failover `json:"failover,omitempty"`
	// FailoverBlocks are the blocks of a failover run in blocks (Options.FailoverBlock), in
	// the order run; FailoverCompare each kedge mode's failover against etcd's.
	FailoverBlocks  []FailoverBlock  `json:"failover_blocks,omitempty"`
	FailoverCompare []FailoverRatio  `json:"failover_compare,omitempty"`
	FalseElections  []FalseElections `json:"false_elections,omitempty"`
	Throughput      []Throughput     `json:"throughput,omitempty"`
	// ThroughputRuns are the throughput scenario's runs, round by round; ThroughputCompare
	// each mode against the baseline (off), paired by round (throughput.go).
	ThroughputRuns    []ThroughputRun     `json:"throughput_runs,omitempty"`
	ThroughputCompare []ThroughputCompare `json:"throughput_compare,omitempty"`
	Heartbeats        []Heartbeats        `json:"heartbeats,omitempty"`
}

func (o *Options) logf(format string, args ...any) {
	if o.Log != nil {
		o.Log(format, args...)
	}
}

// Run runs the selected scenarios and returns the result.
func Run(ctx context.Context, o Options) (*Result, error) {
	peer := ""
	if slices.Contains(o.Modes, ModeEtcd) || slices.Contains(o.FalseModes, ModeEtcd) {
		v, err := raftlab.EtcdVersion(ctx)
		if err != nil {
			return nil, err
		}
		peer = v + " (heartbeat a tenth of the election timeout, pre-vote on)"
	}
	res := &Result{Envelope: bench.NewEnvelope(ctx, Schema, "", map[string]any{
		"tick_ms": ms(o.Tick), "election_ticks": o.ElectionTicks, "nodes": o.Nodes, "trials": o.Trials,
		"false_election_s": o.FalseElectionDuration.Seconds(), "throughput_nodes": o.ThroughputNodes,
		"throughput_s": o.ThroughputDuration.Seconds(), "throughput_rounds": o.ThroughputRounds, "throughput_concurrent": o.Concurrent, "bpf_stats": o.BPFStats, "clients": o.Clients, "scenarios": o.Scenarios,
		"modes": o.Modes, "false_modes": o.FalseModes, "false_phases": o.FalsePhases, "false_until_change": o.UntilChange, "stall_iops": o.StallIOPS, "disk_nodes": o.diskNodes(), "failover_clients": o.failoverClients(), "failover_attempt_ms": ms(o.FailoverAttempt), "failover_block": o.FailoverBlock, "throughput_routings": o.routings(), "throughput_keys": throughputKeys, "throughput_value_bytes": throughputValueBytes,
		"heartbeat_ticks": o.HeartbeatTicks, "heartbeat_lease_ms": ms(o.HeartbeatLease), "offload_alive_ms": ms(o.OffloadAlive), "heartbeat_s": o.HeartbeatDuration.Seconds(),
		"authenticated": o.ClusterKey != "", "peer": peer,
	})}
	for _, sc := range o.Scenarios {
		var err error
		switch sc {
		case "failover":
			for _, et := range o.ElectionTicks {
				var f []Failover
				var blocks []FailoverBlock
				f, blocks, err = o.failover(ctx, et)
				res.Failover = append(res.Failover, f...)
				res.FailoverBlocks = append(res.FailoverBlocks, blocks...)
				if err != nil {
					break
				}
			}
			res.FailoverCompare = CompareFailover(res.Failover)
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
			// kedge's heartbeat paths only: the peer is left out.
			ho := o
			ho.Modes = slices.DeleteFunc(slices.Clone(o.Modes), func(m string) bool { return m == ModeEtcd })
			var hb []Heartbeats
			if len(ho.Modes) > 0 {
				hb, err = ho.heartbeats(ctx)
			}
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

// WriteCharts draws the failover CDF (one line per mode, election timeout and client) and
// the write latency CDF (one per mode, cluster size and routing) next to result.json.
func WriteCharts(dir string, r *Result) error {
	var errs []error
	if len(r.Failover) > 0 {
		var ss []bench.Series
		for _, f := range r.Failover {
			ss = append(ss, series(fmt.Sprintf("offload %s, election timeout %.0f ms, client %s", f.Offload, f.ElectionTimeoutMs, clientName(f.Client)), f.FailoverMs, 1000))
		}
		errs = append(errs, bench.WriteCDF(filepath.Join(dir, "failover"), ss, bench.ChartOptions{
			Title: "failover: kill -9 of the leader -> first acknowledged write"}))
	}
	if len(r.Throughput) > 0 {
		var ss []bench.Series
		for _, t := range r.Throughput {
			ss = append(ss, series(fmt.Sprintf("offload %s, %d nodes, %d clients, to %s", t.Offload, t.Nodes, t.Clients, routingName(t.Routing)), t.LatenciesUS, 1))
		}
		errs = append(errs, bench.WriteCDF(filepath.Join(dir, "write-latency"), ss, bench.ChartOptions{Title: "write latency"}))
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
