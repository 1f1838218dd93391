package raftbench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/raft/offload"
	"github.com/kedge-dev/kedge/internal/raftlab"
)

// The throughput scenario, paired: one cluster per mode, built once and reused for every
// round; each round runs every mode once, in turn, for ThroughputDuration while the other
// modes' clusters stay up and idle (heartbeating, no writes); the order alternates between
// rounds (on, off / off, on / ...) so that a drift of the machine over the run falls on both
// modes alike. A mode is compared with the baseline (off) round by round: the ratio of two
// runs seconds apart, not of two separately started runs.
//
// Concurrent (--tp-concurrent): each round runs every mode's writers at the same time
// instead, each cluster with its own writers. On a machine whose load comes and goes (other
// work, the bench's own clients) sequential runs of one mode see another machine than the
// other's; concurrent runs share every second of it, and what one mode costs more shows as
// fewer writes and more node CPU per write beside the other. An A/A check (two clusters of
// the same mode at once) resolves node CPU per write to about 1% on the 2-vCPU machine
// (docs/raft.md section 12). The machine-wide figures cannot be split between clusters
// that ran at once: they are left at 0.
//
// Idle rather than stopped: SIGSTOPping a cluster lets its kernel detector fire and its
// resumption start an election, and rebuilding clusters per round adds a start-up (and the
// pacer's calibration) to every round. The idle clusters' cost is measured (their node
// processes' CPU over each run) and printed with the run, so any asymmetry in it is visible.

// throughputLatencyPoints bounds the latencies kept in result.json per mode (for the chart):
// the pooled, sorted latencies of all rounds thinned evenly in rank.
const throughputLatencyPoints = 5000

// WriteStats are the figures of closed-loop writes (inlined into the JSON of the types
// that embed it).
type WriteStats struct {
	DurationS float64 `json:"duration_s"`
	Writes    int     `json:"writes"` // acknowledged
	Errors    int     `json:"errors"`
	PerSecond float64 `json:"writes_per_s"`
	P50Ms     float64 `json:"p50_ms"`
	P99Ms     float64 `json:"p99_ms"`
	MaxMs     float64 `json:"max_ms"`
}

// set fills the figures from the writes' latencies (sorted, microseconds), errors and duration.
func (w *WriteStats) set(sortedUS []float64, errors int, durationS float64) {
	w.Writes, w.Errors, w.DurationS = len(sortedUS), errors, durationS
	if durationS > 0 {
		w.PerSecond = float64(w.Writes) / durationS
	}
	if len(sortedUS) > 0 {
		w.P50Ms, w.P99Ms = bench.Percentile(sortedUS, 50)/1000, bench.Percentile(sortedUS, 99)/1000
		w.MaxMs = sortedUS[len(sortedUS)-1] / 1000
	}
}

// Throughput is one mode's closed-loop writes against the leader, pooled over its rounds
// (ThroughputRun each; a result of before the rounds has one run per mode and no Rounds).
type Throughput struct {
	Offload    string `json:"offload"`
	Nodes      int    `json:"nodes"`
	Clients    int    `json:"clients"`
	Routing    string `json:"routing,omitempty"`
	Rounds     int    `json:"rounds,omitempty"`
	WriteStats        // DurationS summed over the rounds
	// LatenciesUS of the acknowledged writes (for the chart), sorted and, over 5000,
	// thinned evenly in rank (a result of before the rounds: all of them, unsorted).
	LatenciesUS []float64 `json:"latencies_us"`
}

// ThroughputRun is one mode's closed-loop write run in one round.
type ThroughputRun struct {
	Round int `json:"round"` // from 0
	Slot  int `json:"slot"`  // position in the round's order (0: first; concurrent runs: all 0)
	// Concurrent: every mode's writers ran at the same time (--tp-concurrent); the
	// machine's figures (MachineCPUUs, SoftirqUs) are then shared and left at 0.
	Concurrent bool   `json:"concurrent,omitempty"`
	Offload    string `json:"offload"`
	Nodes      int    `json:"nodes"`
	Clients    int    `json:"clients"`
	// Routing: RouteLeader or RouteSpread ("" in results of before it: the leader).
	Routing string `json:"routing,omitempty"`
	Leader  int    `json:"leader"`
	// TermChange is how far the leader's term moved over the run, LeaderAfter the leader
	// after it: a fault-free run has 0 and Leader (an election during a run stalls writes).
	TermChange  uint64 `json:"term_change"`
	LeaderAfter int    `json:"leader_after"`
	// ErrorKinds counts the failed writes by error text (a write that timed out after 5 s
	// is "unknown: ...").
	ErrorKinds map[string]int `json:"error_kinds,omitempty"`
	WriteStats
	// NodeCPUUs is the user + system time of the cluster's node processes per acknowledged
	// write (XDP and TC run in softirq: charged to whichever process was interrupted, or to
	// the softirq column of /proc/stat - MachineCPUUs counts them either way).
	NodeCPUUs float64 `json:"node_cpu_us_per_write"`
	// MachineCPUUs is the machine's busy CPU time (/proc/stat: all but idle and iowait: the
	// nodes, the clients, softirq, anything else running) less the idle clusters' node
	// processes (OtherCPUMs: the idle user-space cluster costs more than an idle one with
	// the kernel paths), per write; SoftirqUs the softirq part (not less anything).
	MachineCPUUs float64 `json:"machine_cpu_us_per_write"`
	SoftirqUs    float64 `json:"softirq_us_per_write"`
	// XDPNsPerWrite and XDPRunsPerWrite: with Options.BPFStats, the run time and the runs
	// of the XDP programs on the measured cluster's node interfaces (the follower program,
	// on every node in modes on and follower), summed over the nodes, per write. The run
	// time is the program's own (BPF_ENABLE_STATS): not what generic XDP costs around it.
	XDPNsPerWrite   float64 `json:"xdp_ns_per_write,omitempty"`
	XDPRunsPerWrite float64 `json:"xdp_runs_per_write,omitempty"`
	// XDPRaftPerWrite: of those runs, the raft packets (UDP to the raft port: authenticated
	// in XDP); the rest (TCP appends, client HTTP) are parsed and passed.
	XDPRaftPerWrite float64 `json:"xdp_raft_per_write,omitempty"`
	// Mode on: the leader's kernel heartbeat sender over the run, per second - heartbeats
	// the kernel sent, the passes of its pacer's frames (tick_passes + filler_passes:
	// softirq work no process is charged for), and rounds user space covered because the
	// kernel's was overdue (sender counter "overdue").
	KernelHeartbeatsPerS float64 `json:"kernel_heartbeats_per_s,omitempty"`
	PacerPassesPerS      float64 `json:"pacer_passes_per_s,omitempty"`
	OverduePerS          float64 `json:"overdue_per_s,omitempty"`
	// Modes on and follower: the heartbeats the nodes synthesized from their programs'
	// records over the run, per second, summed over the nodes - stepped into etcd-raft, or
	// left out because an append had done what they would (docs/raft.md section 14).
	SynthSteppedPerS float64 `json:"synth_stepped_per_s,omitempty"`
	SynthSkippedPerS float64 `json:"synth_skipped_per_s,omitempty"`
	// FsyncsPerWrite and FsyncMeanUs: the WAL fsyncs of the cluster's nodes over the run
	// (summed over the nodes) per write, and their mean duration - each system's own
	// histogram (kedge_raft_wal_fsync_seconds, etcd_disk_wal_fsync_duration_seconds).
	FsyncsPerWrite float64 `json:"fsyncs_per_write,omitempty"`
	FsyncMeanUs    float64 `json:"fsync_mean_us,omitempty"`
	// OtherCPUMs is the user + system time of the other modes' (idle) clusters' node
	// processes over the run.
	OtherCPUMs float64 `json:"other_clusters_cpu_ms"`
	Load1      float64 `json:"load1"` // the machine's 1-minute load average at the start
	// LatenciesUS of the run's acknowledged writes (pooled per mode into Throughput; not
	// written to result.json).
	LatenciesUS []float64 `json:"-"`
}

// Ratio is one figure of a mode divided by the baseline's, per round, and its summary.
type Ratio struct {
	PerRound []float64 `json:"per_round"`
	Median   float64   `json:"median"` // of the per-round ratios (mean of the middle two for an even count)
	Min      float64   `json:"min"`
	Max      float64   `json:"max"`
	Below    int       `json:"below_1"` // rounds with the ratio below 1
	Above    int       `json:"above_1"`
	// SignP is the two-sided exact sign test of "below and above 1 equally likely" (ties
	// left out): 6 of 6 rounds on one side give 0.031, 5 of 6 give 0.22.
	SignP float64 `json:"sign_test_p"`
}

// ThroughputCompare is one mode against the baseline over the rounds (paired by round).
type ThroughputCompare struct {
	Offload   string `json:"offload"`
	Baseline  string `json:"baseline"`
	Nodes     int    `json:"nodes"`
	Routing   string `json:"routing,omitempty"`
	Rounds    int    `json:"rounds"`
	PerSecond Ratio  `json:"writes_per_s"`
	P50       Ratio  `json:"p50"`
	P99       Ratio  `json:"p99"`
	NodeCPU   Ratio  `json:"node_cpu_per_write"`
	// MachineCPU is the machine's busy CPU per write (what the whole box paid per write);
	// nil for concurrent runs (the machine's CPU is not one cluster's).
	MachineCPU *Ratio `json:"machine_cpu_per_write,omitempty"`
}

// roundOrder is the order of the modes in round r: as given in even rounds, reversed in odd
// ones (on, off / off, on / ...: every adjacent pair of rounds is balanced).
func roundOrder(modes []string, r int) []string {
	out := slices.Clone(modes)
	if r%2 == 1 {
		slices.Reverse(out)
	}
	return out
}

// baselineMode is what the other modes are divided by: the peer (etcd) when it runs, else
// off when it runs, else the last mode.
func baselineMode(modes []string) string {
	if slices.Contains(modes, ModeEtcd) {
		return ModeEtcd
	}
	if slices.Contains(modes, ModeOff) {
		return ModeOff
	}
	return modes[len(modes)-1]
}

// signTestP is the two-sided exact sign test's p-value for below and above out of the
// untied rounds: P(a count as extreme as min(below, above) under Binomial(n, 1/2)), doubled.
func signTestP(below, above int) float64 {
	n := below + above
	if n == 0 {
		return 1
	}
	k := min(below, above)
	// sum_{i<=k} C(n, i) / 2^n, computed in floating point (n is a few dozen at most).
	c, sum := 1.0, 0.0
	for i := 0; i <= k; i++ {
		if i > 0 {
			c = c * float64(n-i+1) / float64(i)
		}
		sum += c
	}
	return math.Min(1, 2*sum/math.Pow(2, float64(n)))
}

// newRatio summarizes per-round ratios.
func newRatio(per []float64) Ratio {
	r := Ratio{PerRound: per, Median: bench.Median(per), Min: math.NaN(), Max: math.NaN()}
	for _, v := range per {
		if math.IsNaN(v) {
			continue
		}
		if math.IsNaN(r.Min) || v < r.Min {
			r.Min = v
		}
		if math.IsNaN(r.Max) || v > r.Max {
			r.Max = v
		}
		switch {
		case v < 1:
			r.Below++
		case v > 1:
			r.Above++
		}
	}
	r.SignP = signTestP(r.Below, r.Above)
	return r
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}

// CompareThroughput pairs each mode's runs with the baseline's run of the same round (and
// cluster size) and summarizes the ratios; modes are in the order given, the baseline left out.
func CompareThroughput(runs []ThroughputRun, modes []string) []ThroughputCompare {
	if len(modes) == 0 {
		return nil
	}
	base := baselineMode(modes)
	type key struct {
		nodes, round int
		routing      string
		mode         string
	}
	byKey := map[key]*ThroughputRun{}
	var groups []group
	for i := range runs {
		r := &runs[i]
		byKey[key{r.Nodes, r.Round, r.Routing, r.Offload}] = r
		if g := (group{r.Nodes, r.Routing}); !slices.Contains(groups, g) {
			groups = append(groups, g)
		}
	}
	var out []ThroughputCompare
	for _, g := range groups {
		n := g.nodes
		for _, mode := range modes {
			if mode == base {
				continue
			}
			var ws, p50, p99, cpu, mcpu []float64
			for i := range runs {
				m := &runs[i]
				if m.Nodes != n || m.Routing != g.routing || m.Offload != mode {
					continue
				}
				b := byKey[key{n, m.Round, g.routing, base}]
				if b == nil {
					continue // the round was cut short before the baseline ran
				}
				ws = append(ws, ratio(m.PerSecond, b.PerSecond))
				p50 = append(p50, ratio(m.P50Ms, b.P50Ms))
				p99 = append(p99, ratio(m.P99Ms, b.P99Ms))
				cpu = append(cpu, ratio(m.NodeCPUUs, b.NodeCPUUs))
				if !m.Concurrent {
					mcpu = append(mcpu, ratio(m.MachineCPUUs, b.MachineCPUUs))
				}
			}
			if len(ws) == 0 {
				continue
			}
			tc := ThroughputCompare{Offload: mode, Baseline: base, Nodes: n, Routing: g.routing, Rounds: len(ws),
				PerSecond: newRatio(ws), P50: newRatio(p50), P99: newRatio(p99), NodeCPU: newRatio(cpu)}
			if len(mcpu) > 0 {
				r := newRatio(mcpu)
				tc.MachineCPU = &r
			}
			out = append(out, tc)
		}
	}
	return out
}

// group is a cluster size and a routing: the runs compared and pooled together.
type group struct {
	nodes   int
	routing string
}

// poolThroughput is each mode's summary over all its rounds: writes and errors summed,
// writes/s over the summed duration, percentiles over the pooled latencies (kept thinned).
func poolThroughput(runs []ThroughputRun, modes []string) []Throughput {
	var out []Throughput
	var groups []group
	for _, r := range runs {
		if g := (group{r.Nodes, r.Routing}); !slices.Contains(groups, g) {
			groups = append(groups, g)
		}
	}
	for _, g := range groups {
		n := g.nodes
		for _, mode := range modes {
			t := Throughput{Offload: mode, Nodes: n, Routing: g.routing}
			var lat []float64
			var errs int
			var d float64
			for _, r := range runs {
				if r.Nodes != n || r.Routing != g.routing || r.Offload != mode {
					continue
				}
				t.Clients = r.Clients
				t.Rounds++
				d += r.DurationS
				errs += r.Errors
				lat = append(lat, r.LatenciesUS...)
			}
			if t.Rounds == 0 {
				continue
			}
			slices.Sort(lat)
			t.set(lat, errs, d)
			t.LatenciesUS = thin(lat, throughputLatencyPoints)
			out = append(out, t)
		}
	}
	return out
}

// thin keeps at most n of the sorted values, evenly spaced in rank, the first and last
// included (a CDF drawn from them is the full one's to within 1/n).
func thin(sorted []float64, n int) []float64 {
	if len(sorted) <= n {
		return sorted
	}
	out := make([]float64, n)
	for i := range n {
		out[i] = sorted[i*(len(sorted)-1)/(n-1)]
	}
	return out
}

// throughput runs o.ThroughputRounds rounds of every mode on clusters of `nodes` nodes.
func (o *Options) throughput(ctx context.Context, nodes int) (runs []ThroughputRun, err error) {
	cs, closeAll, err := o.clusters(ctx, fmt.Sprintf("rbt%d", nodes), nodes, 10)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, closeAll()) }()
	// A warm-up per cluster, not counted: the first writes after a start pay for
	// connections, the WAL's first segment and cold caches, and would fall on round 0's
	// first mode only.
	warm := min(2*time.Second, o.ThroughputDuration/5)
	for _, mode := range o.Modes {
		if _, err := o.writeRuns(ctx, cs, nodes, []string{mode}, o.routings()[0], warm); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	if o.BPFStats {
		// While this file descriptor is held the kernel times every BPF program's runs
		// (BPF_ENABLE_STATS: no sysctl is written; closing it ends the timing).
		st, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
		if err != nil {
			return nil, fmt.Errorf("enable BPF run-time statistics: %w (Linux 5.8+; run without --tp-bpf-stats)", err)
		}
		defer st.Close()
	}
	rounds := max(o.ThroughputRounds, 1)
	for r := range rounds {
		for _, routing := range roundOrder(o.routings(), r) {
			// A round: every mode in turn (the order alternating), or all at once.
			batches := [][]string{}
			if o.Concurrent {
				batches = append(batches, o.Modes)
			} else {
				for _, mode := range roundOrder(o.Modes, r) {
					batches = append(batches, []string{mode})
				}
			}
			for slot, modes := range batches {
				rs, err := o.writeRuns(ctx, cs, nodes, modes, routing, o.ThroughputDuration)
				if err != nil {
					return runs, fmt.Errorf("round %d: %w", r, err)
				}
				for _, run := range rs {
					run.Round, run.Slot = r, slot
					o.logf("throughput, %d nodes, round %d/%d, routing %s, offload %s: %.0f writes/s, p50 %.2f ms, p99 %.2f ms, node CPU %.0f us/write, machine %.0f us/write (softirq %.1f), XDP %.0f ns and %.1f runs (%.1f raft)/write, kernel heartbeats %.0f/s (pacer %.0f passes/s, overdue %.1f/s), synthesized heartbeats %.0f/s stepped, %.0f/s skipped, WAL fsyncs %.2f/write of %.0f us, other clusters %.0f ms CPU, load %.1f, term +%d, leader %d -> %d, errors %v",
						nodes, r+1, rounds, routing, run.Offload, run.PerSecond, run.P50Ms, run.P99Ms, run.NodeCPUUs, run.MachineCPUUs, run.SoftirqUs, run.XDPNsPerWrite, run.XDPRunsPerWrite, run.XDPRaftPerWrite, run.KernelHeartbeatsPerS, run.PacerPassesPerS, run.OverduePerS, run.SynthSteppedPerS, run.SynthSkippedPerS, run.FsyncsPerWrite, run.FsyncMeanUs, run.OtherCPUMs, run.Load1, run.TermChange, run.Leader, run.LeaderAfter, run.ErrorKinds)
					runs = append(runs, run)
				}
			}
		}
	}
	return runs, nil
}

// The throughput workload: each writer puts 64-byte values to keys drawn from 1000.
const (
	throughputKeys       = 1000
	throughputValueBytes = 64
)

// routings are the throughput runs' routings (RouteLeader when none is given).
func (o *Options) routings() []string {
	if len(o.ThroughputRoutings) == 0 {
		return []string{RouteLeader}
	}
	return o.ThroughputRoutings
}

// clusterCPU is the user + system time of every running node process of c.
func clusterCPU(c *raftlab.Cluster) time.Duration {
	var sum time.Duration
	for _, n := range c.Nodes {
		if pid := c.PID(n.ID); pid != 0 {
			if t, err := bench.ProcCPU(pid); err == nil {
				sum += t
			}
		}
	}
	return sum
}

// xdpCounts are the XDP follower programs' figures summed over a cluster's nodes.
type xdpCounts struct {
	runtime    time.Duration
	runs, raft uint64 // raft: the runs that were raft packets (UDP to the raft port)
}

// xdpStats reads the run time and runs of the follower programs on c's nodes (modes
// without the kernel paths: none).
func xdpStats(c *raftlab.Cluster, mode string) (xdpCounts, error) {
	var x xdpCounts
	if !kernelPaths(mode) {
		return x, nil
	}
	for _, n := range c.Nodes {
		in, err := offload.Inspect(n.Host.Handle, n.Host.Iface)
		if err != nil {
			return x, fmt.Errorf("node %d: %w", n.ID, err)
		}
		prog, err := ebpf.NewProgramFromID(ebpf.ProgramID(in.ProgID))
		if err != nil {
			return x, fmt.Errorf("open XDP program %d of node %d: %w", in.ProgID, n.ID, err)
		}
		st, err := prog.Stats()
		prog.Close()
		if err != nil {
			return x, fmt.Errorf("XDP program %d of node %d: %w", in.ProgID, n.ID, err)
		}
		x.runtime += st.Runtime
		x.runs += st.RunCount
		x.raft += in.Counters["rx"]
	}
	return x, nil
}

// senderCounts are the leader's kernel heartbeat counters (mode on).
type senderCounts struct{ heartbeats, passes, overdue float64 }

// leaderSender reads them from the leader's metrics.
func leaderSender(ctx context.Context, c *raftlab.Cluster, leader int) (senderCounts, error) {
	cl := raftlab.NewClient(c.Client, 2*time.Second)
	defer cl.Close()
	addr := c.Node(leader).ClientAddr.String()
	var errs []error
	metric := func(name, label string) float64 {
		v, err := cl.Metric(ctx, addr, name, label)
		errs = append(errs, err)
		return v
	}
	sc := senderCounts{
		heartbeats: metric("kedge_raft_heartbeat_sender_total", `counter="heartbeats"`),
		passes: metric("kedge_raft_heartbeat_pacer_total", `counter="tick_passes"`) +
			metric("kedge_raft_heartbeat_pacer_total", `counter="filler_passes"`),
		overdue: metric("kedge_raft_heartbeat_sender_total", `counter="overdue"`),
	}
	return sc, errors.Join(errs...)
}

// synthCounts are the heartbeats a cluster's nodes synthesized from their programs'
// records (kedge_raft_offload_synth_heartbeats_total), summed over the nodes.
type synthCounts struct{ stepped, skipped float64 }

func synthHeartbeats(ctx context.Context, c *raftlab.Cluster) (synthCounts, error) {
	cl := raftlab.NewClient(c.Client, 2*time.Second)
	defer cl.Close()
	const name = "kedge_raft_offload_synth_heartbeats_total"
	var sc synthCounts
	var errs []error
	for _, n := range c.Nodes {
		addr := n.ClientAddr.String()
		stepped, err1 := cl.Metric(ctx, addr, name, `result="stepped"`)
		skipped, err2 := cl.Metric(ctx, addr, name, `result="skipped"`)
		sc.stepped, sc.skipped = sc.stepped+stepped, sc.skipped+skipped
		errs = append(errs, err1, err2)
	}
	return sc, errors.Join(errs...)
}

// fsyncCounts are a cluster's WAL fsyncs and their summed duration (s), over its nodes.
type fsyncCounts struct{ n, s float64 }

func walFsyncs(ctx context.Context, c *raftlab.Cluster) (fsyncCounts, error) {
	cl := raftlab.NewClient(c.Client, 2*time.Second)
	defer cl.Close()
	name := "kedge_raft_wal_fsync_seconds"
	if c.Spec.Etcd() {
		name = "etcd_disk_wal_fsync_duration_seconds"
	}
	var fc fsyncCounts
	var errs []error
	for _, n := range c.Nodes {
		addr := n.ClientAddr.String()
		count, err1 := cl.Metric(ctx, addr, name+"_count")
		sum, err2 := cl.Metric(ctx, addr, name+"_sum")
		fc.n, fc.s = fc.n+count, fc.s+sum
		errs = append(errs, err1, err2)
	}
	return fc, errors.Join(errs...)
}

// meter is one mode's run in the making: the cluster, the run's record and the counters read
// before its writers started.
type meter struct {
	c                *raftlab.Cluster
	t                ThroughputRun
	st0              uint64 // the leader's term at the start
	nodeCPU0, other0 time.Duration
	xdp0             xdpCounts
	snd0             senderCounts
	synth0           synthCounts
	fsync0           fsyncCounts
	mu               sync.Mutex
	errs             int
}

// otherCPU is the node processes' CPU of every cluster but mode's.
func otherCPU(cs map[string]*raftlab.Cluster, mode string) time.Duration {
	var sum time.Duration
	for m, oc := range cs {
		if m != mode {
			sum += clusterCPU(oc)
		}
	}
	return sum
}

// begin waits for mode's cluster to settle and reads its counters.
func (o *Options) begin(ctx context.Context, cs map[string]*raftlab.Cluster, nodes int, mode, routing string) (*meter, error) {
	m := &meter{c: cs[mode], t: ThroughputRun{Offload: mode, Nodes: nodes, Clients: o.Clients, Routing: routing}}
	// The previous run's writes applied everywhere and one leader: the same start each time.
	leader, err := stableLeader(ctx, m.c)
	if err != nil {
		return nil, err
	}
	m.t.Leader = leader
	st0, err := m.c.Status(ctx, leader)
	if err != nil {
		return nil, err
	}
	m.st0 = st0.Term
	if l := bench.LoadAvg(); len(l) > 0 {
		m.t.Load1 = l[0]
	}
	m.nodeCPU0, m.other0 = clusterCPU(m.c), otherCPU(cs, mode)
	if o.BPFStats {
		if m.xdp0, err = xdpStats(m.c, mode); err != nil {
			return nil, err
		}
	}
	if kernelHeartbeats(mode) {
		if m.snd0, err = leaderSender(ctx, m.c, leader); err != nil {
			return nil, fmt.Errorf("read the leader's kernel heartbeat counters: %w", err)
		}
	}
	if kernelPaths(mode) {
		if m.synth0, err = synthHeartbeats(ctx, m.c); err != nil {
			return nil, fmt.Errorf("read the nodes' synthesized heartbeat counters: %w", err)
		}
	}
	if m.fsync0, err = walFsyncs(ctx, m.c); err != nil {
		return nil, fmt.Errorf("read the nodes' WAL fsync counters: %w", err)
	}
	return m, nil
}

// write runs closed-loop writer i against m's cluster until runCtx ends: to the leader, or
// spread over every node (RouteSpread; writer i starts at node i+1).
func (m *meter) write(ctx, runCtx context.Context, i int) {
	ids := []int{m.t.Leader}
	if m.t.Routing == RouteSpread {
		ids = nil
		for k := range m.c.Nodes {
			ids = append(ids, m.c.Nodes[(i+k)%len(m.c.Nodes)].ID)
		}
	}
	w, err := m.c.NewWriter(ids, 5*time.Second)
	if err != nil {
		m.mu.Lock()
		m.errs++
		m.t.ErrorKinds = map[string]int{"writer: " + err.Error(): 1}
		m.mu.Unlock()
		return
	}
	defer w.Close()
	var lat []float64
	e := 0
	kinds := map[string]int{}
	value := make([]byte, throughputValueBytes)
	for n := 0; runCtx.Err() == nil; n++ {
		// Keys in a stride over the 1000 (every writer its own start), values of 64 bytes
		// naming the writer and the write.
		key := fmt.Sprintf("tp/%03d", (i*37+n*7)%throughputKeys)
		tag := fmt.Appendf(value[:0], "%d.%d.", i, n)
		for k := len(tag); k < throughputValueBytes; k++ {
			value[k] = 'v'
		}
		t0 := time.Now()
		unknown, err := w.Put(ctx, key, string(value))
		if err != nil {
			e++
			k := err.Error()
			if unknown {
				k = "unknown: " + k
			}
			kinds[k]++
			continue
		}
		lat = append(lat, float64(time.Since(t0).Microseconds()))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.t.LatenciesUS = append(m.t.LatenciesUS, lat...)
	m.errs += e
	for k, v := range kinds {
		if m.t.ErrorKinds == nil {
			m.t.ErrorKinds = map[string]int{}
		}
		m.t.ErrorKinds[k] += v
	}
}

// end reads m's counters after its writers stopped and fills the run's figures. machine is
// the machine's CPU over the run; shared says other clusters wrote at the same time (the
// machine's figures are then not this cluster's: left at 0).
func (o *Options) end(ctx context.Context, cs map[string]*raftlab.Cluster, m *meter, el time.Duration, machine bench.CPUTimes, shared bool) (ThroughputRun, error) {
	t, c, mode := m.t, m.c, m.t.Offload
	t.Concurrent = shared
	if kernelHeartbeats(mode) {
		// From the leader the run started with (a run whose term changed says so: TermChange).
		if snd, err := leaderSender(ctx, c, t.Leader); err == nil {
			t.KernelHeartbeatsPerS = (snd.heartbeats - m.snd0.heartbeats) / el.Seconds()
			t.PacerPassesPerS = (snd.passes - m.snd0.passes) / el.Seconds()
			t.OverduePerS = (snd.overdue - m.snd0.overdue) / el.Seconds()
		}
	}
	if kernelPaths(mode) {
		if sy, err := synthHeartbeats(ctx, c); err == nil {
			t.SynthSteppedPerS = (sy.stepped - m.synth0.stepped) / el.Seconds()
			t.SynthSkippedPerS = (sy.skipped - m.synth0.skipped) / el.Seconds()
		}
	}
	fs, fsErr := walFsyncs(ctx, c)
	// The newest term any node knows after the run, and its leader (the leader may have
	// changed; a node that lags may still report the old term).
	for _, n := range c.Nodes {
		st, err := c.Status(ctx, n.ID)
		if err != nil || st.Term < m.st0 {
			continue
		}
		if d := st.Term - m.st0; d > t.TermChange || (d == t.TermChange && t.LeaderAfter == 0) {
			t.TermChange, t.LeaderAfter = d, int(st.Leader)
		}
	}
	nodeCPU, other := clusterCPU(c)-m.nodeCPU0, otherCPU(cs, mode)-m.other0
	var xdp xdpCounts
	if o.BPFStats {
		var err error
		if xdp, err = xdpStats(c, mode); err != nil {
			return t, err
		}
		xdp = xdpCounts{xdp.runtime - m.xdp0.runtime, xdp.runs - m.xdp0.runs, xdp.raft - m.xdp0.raft}
	}
	slices.Sort(t.LatenciesUS)
	t.set(t.LatenciesUS, m.errs, el.Seconds())
	t.OtherCPUMs = ms(other)
	if t.Writes > 0 {
		t.NodeCPUUs = float64(nodeCPU.Microseconds()) / float64(t.Writes)
		if !shared {
			t.MachineCPUUs = float64((machine.Busy - other).Microseconds()) / float64(t.Writes)
			t.SoftirqUs = float64(machine.Softirq.Microseconds()) / float64(t.Writes)
		}
		t.XDPNsPerWrite = float64(xdp.runtime.Nanoseconds()) / float64(t.Writes)
		t.XDPRunsPerWrite = float64(xdp.runs) / float64(t.Writes)
		t.XDPRaftPerWrite = float64(xdp.raft) / float64(t.Writes)
		if n := fs.n - m.fsync0.n; fsErr == nil && n > 0 {
			t.FsyncsPerWrite = n / float64(t.Writes)
			t.FsyncMeanUs = (fs.s - m.fsync0.s) / n * 1e6
		}
	}
	return t, nil
}

// writeRuns runs o.Clients closed-loop writers against the leader of each of modes'
// clusters, all at once, for d while the other clusters stay idle, and measures what each
// mode's run cost. With one mode it is a run on its own; with several (--tp-concurrent)
// every mode's writers share the same seconds of the machine.
func (o *Options) writeRuns(ctx context.Context, cs map[string]*raftlab.Cluster, nodes int, modes []string, routing string, d time.Duration) ([]ThroughputRun, error) {
	meters := make([]*meter, len(modes))
	for i, mode := range modes {
		m, err := o.begin(ctx, cs, nodes, mode, routing)
		if err != nil {
			return nil, fmt.Errorf("offload %s: %w", mode, err)
		}
		meters[i] = m
	}
	machine0, err := bench.ReadCPU()
	if err != nil {
		return nil, err
	}
	var wg sync.WaitGroup
	runCtx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	for i := range o.Clients {
		for _, m := range meters {
			wg.Go(func() { m.write(ctx, runCtx, i) })
		}
	}
	wg.Wait()
	el := time.Since(start)
	machine1, err := bench.ReadCPU()
	if err != nil {
		return nil, err
	}
	runs := make([]ThroughputRun, len(meters))
	for i, m := range meters {
		if runs[i], err = o.end(ctx, cs, m, el, machine1.Sub(machine0), len(meters) > 1); err != nil {
			return nil, fmt.Errorf("offload %s: %w", modes[i], err)
		}
	}
	return runs, nil
}
