// Package raftbench measures kedge raft in a lab cluster (`kedge bench raft`): failover
// time after kill -9 of the leader, leader changes without a crash (false elections) under
// CPU pressure, and write throughput and latency. These are the user-space transport's
// figures that part 2 (XDP fast paths) must beat.
package raftbench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/raftlab"
)

// Schema of result.json.
const Schema = "kedge.bench.raft/v1"

// Options selects and sizes the runs.
type Options struct {
	Binary string // kedge binary for the nodes
	Dir    string // work directory (cluster data, logs)
	Log    func(format string, args ...any)

	Scenarios     []string      // failover, false-elections, throughput
	Tick          time.Duration // raft tick (10ms)
	ElectionTicks []int         // failover and false elections: one setting each (e.g. 5,10,20)
	Nodes         int           // failover and false elections: cluster size (3)

	Trials int // failover trials per setting (>= 50 for the committed figures)
	// FalseElectionDuration is each false-election run's length (per scenario and setting).
	FalseElectionDuration time.Duration

	ThroughputNodes    []int // (3, 5)
	ThroughputDuration time.Duration
	Clients            int // concurrent writers in the throughput run
}

// Result is result.json.
type Result struct {
	bench.Envelope
	Failover       []Failover       `json:"failover,omitempty"`
	FalseElections []FalseElections `json:"false_elections,omitempty"`
	Throughput     []Throughput     `json:"throughput,omitempty"`
}

// Failover is one election-timeout setting's trials: kill -9 of the leader until the first
// write acknowledged through a surviving node.
type Failover struct {
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
}

// FalseElections is one run without any crash: leader changes seen while it lasted.
type FalseElections struct {
	Scenario          string  `json:"scenario"` // idle, spinners (2 per CPU), starved-follower
	Nodes             int     `json:"nodes"`
	ElectionTicks     int     `json:"election_ticks"`
	ElectionTimeoutMs float64 `json:"election_timeout_ms"`
	DurationS         float64 `json:"duration_s"`
	LeaderChanges     int     `json:"leader_changes"` // new (term, leader) pairs after the first
	TermIncrease      uint64  `json:"term_increase"`
	PerMinute         float64 `json:"per_minute"`
}

// Throughput is one closed-loop write run against the leader.
type Throughput struct {
	Nodes     int     `json:"nodes"`
	Clients   int     `json:"clients"`
	DurationS float64 `json:"duration_s"`
	Writes    int     `json:"writes"`
	Errors    int     `json:"errors"`
	PerSecond float64 `json:"writes_per_s"`
	P50Ms     float64 `json:"p50_ms"`
	P99Ms     float64 `json:"p99_ms"`
	MaxMs     float64 `json:"max_ms"`
	// LatenciesUS of the acknowledged writes (for the chart).
	LatenciesUS []float64 `json:"latencies_us"`
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
		"throughput_s": o.ThroughputDuration.Seconds(), "clients": o.Clients, "scenarios": o.Scenarios,
		"transport": "user space (UDP + TCP), part 1",
	})}
	for _, sc := range o.Scenarios {
		var err error
		switch sc {
		case "failover":
			for _, et := range o.ElectionTicks {
				var f Failover
				if f, err = o.failover(ctx, et); err == nil {
					res.Failover = append(res.Failover, f)
				}
				if err != nil {
					break
				}
			}
		case "false-elections":
			for _, et := range o.ElectionTicks {
				var fe []FalseElections
				if fe, err = o.falseElections(ctx, et); err == nil {
					res.FalseElections = append(res.FalseElections, fe...)
				}
				if err != nil {
					break
				}
			}
		case "throughput":
			for _, n := range o.ThroughputNodes {
				var t Throughput
				if t, err = o.throughput(ctx, n); err == nil {
					res.Throughput = append(res.Throughput, t)
				}
				if err != nil {
					break
				}
			}
		default:
			err = fmt.Errorf("unknown scenario %q: use failover, false-elections or throughput", sc)
		}
		if err != nil {
			return res, fmt.Errorf("scenario %s: %w", sc, err)
		}
	}
	return res, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (o *Options) cluster(ctx context.Context, name string, nodes, electionTicks int) (*raftlab.Cluster, error) {
	dir := filepath.Join(o.Dir, name)
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	uctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	return raftlab.Up(uctx, raftlab.Spec{Name: name, Nodes: nodes, Binary: o.Binary, Dir: dir,
		Tick: o.Tick, ElectionTicks: electionTicks})
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

// failover runs o.Trials kill -9 trials with one election timeout.
func (o *Options) failover(ctx context.Context, electionTicks int) (f Failover, err error) {
	c, err := o.cluster(ctx, fmt.Sprintf("rbf%d", electionTicks), o.Nodes, electionTicks)
	if err != nil {
		return f, err
	}
	defer func() { err = errors.Join(err, c.Close()) }()
	f = Failover{Nodes: o.Nodes, TickMs: ms(o.Tick), ElectionTicks: electionTicks,
		ElectionTimeoutMs: ms(o.Tick) * float64(electionTicks), Trials: o.Trials}
	cl := raftlab.NewClient(c.Client, 50*time.Millisecond)
	defer cl.Close()
	for trial := 0; trial < o.Trials; trial++ {
		leader, err := stableLeader(ctx, c)
		if err != nil {
			return f, err
		}
		var survivors []int
		for _, n := range c.Nodes {
			if n.ID != leader {
				survivors = append(survivors, n.ID)
			}
		}
		// One write through a survivor before the kill: the path works.
		if d := firstWrite(ctx, c, cl, survivors, fmt.Sprintf("pre%d", trial), 5*time.Second); d < 0 {
			return f, errors.New("no write succeeded before the kill")
		}
		start := time.Now()
		if err := c.Kill(leader); err != nil {
			return f, err
		}
		d := firstWrite(ctx, c, cl, survivors, fmt.Sprintf("post%d", trial), 10*time.Second)
		if d < 0 {
			f.Failed++
		} else {
			f.FailoverMs = append(f.FailoverMs, ms(time.Since(start)))
		}
		if err := c.Start(leader); err != nil {
			return f, err
		}
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err = c.WaitReady(rctx, leader)
		cancel()
		if err != nil {
			return f, err
		}
		if trial%10 == 9 {
			o.logf("failover, election %d ticks: %d/%d trials", electionTicks, trial+1, o.Trials)
		}
	}
	s := slices.Clone(f.FailoverMs)
	slices.Sort(s)
	if len(s) > 0 {
		f.P50Ms, f.P99Ms, f.MaxMs = bench.Percentile(s, 50), bench.Percentile(s, 99), s[len(s)-1]
	}
	return f, nil
}

// firstWrite puts key through the survivors in turn (50 ms per attempt) until one is
// acknowledged; it returns the time that took, or -1 after limit.
func firstWrite(ctx context.Context, c *raftlab.Cluster, cl *raftlab.Client, via []int, key string, limit time.Duration) time.Duration {
	start := time.Now()
	for i := 0; time.Since(start) < limit && ctx.Err() == nil; i++ {
		op := raftlab.Op{Kind: raftlab.Put, Key: "bench/" + key, Value: fmt.Sprint(i)}
		actx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		cl.Do(actx, c.Node(via[i%len(via)]).ClientAddr, &op)
		cancel()
		if op.Out.Err == "" && !op.Out.Unknown {
			return time.Since(start)
		}
		if !op.Out.Unknown { // refused at once (no leader yet): do not spin on it
			time.Sleep(time.Millisecond) // pacing retries against a refusing node
		}
	}
	return -1
}

// falseElections watches leader changes with no crash: idle, with spinners on every CPU,
// and with one follower starved.
func (o *Options) falseElections(ctx context.Context, electionTicks int) (out []FalseElections, err error) {
	c, err := o.cluster(ctx, fmt.Sprintf("rbe%d", electionTicks), o.Nodes, electionTicks)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, c.Close()) }()
	for _, sc := range []string{"idle", "spinners", "starved-follower"} {
		leader, err := stableLeader(ctx, c)
		if err != nil {
			return out, err
		}
		var stop func() error
		switch sc {
		case "spinners":
			s, err := bench.Spin(2 * runtime.NumCPU())
			if err != nil {
				return out, err
			}
			stop = func() error { s(); return nil }
		case "starved-follower":
			follower := 1
			if leader == 1 {
				follower = 2
			}
			s, err := lab.Starve(c.PID(follower), runtime.NumCPU()-1, 3)
			if err != nil {
				return out, err
			}
			stop = s.Stop
		}
		fe, werr := watchLeaders(ctx, c, o.FalseElectionDuration)
		if stop != nil {
			werr = errors.Join(werr, stop())
		}
		if werr != nil {
			return out, werr
		}
		fe.Scenario, fe.Nodes, fe.ElectionTicks = sc, o.Nodes, electionTicks
		fe.ElectionTimeoutMs = ms(o.Tick) * float64(electionTicks)
		o.logf("false elections, %s, election %d ticks: %d leader changes in %.0fs", sc, electionTicks, fe.LeaderChanges, fe.DurationS)
		out = append(out, fe)
	}
	return out, nil
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

// throughput runs o.Clients closed-loop writers against the leader for the duration.
func (o *Options) throughput(ctx context.Context, nodes int) (t Throughput, err error) {
	c, err := o.cluster(ctx, fmt.Sprintf("rbt%d", nodes), nodes, 10)
	if err != nil {
		return t, err
	}
	defer func() { err = errors.Join(err, c.Close()) }()
	leader, err := stableLeader(ctx, c)
	if err != nil {
		return t, err
	}
	t = Throughput{Nodes: nodes, Clients: o.Clients}
	var mu sync.Mutex
	var wg sync.WaitGroup
	runCtx, cancel := context.WithTimeout(ctx, o.ThroughputDuration)
	defer cancel()
	start := time.Now()
	for i := range o.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := raftlab.NewClient(c.Client, 5*time.Second)
			defer cl.Close()
			var lat []float64
			errs := 0
			for n := 0; runCtx.Err() == nil; n++ {
				op := raftlab.Op{Kind: raftlab.Put, Key: fmt.Sprintf("tp/%d", n%64), Value: fmt.Sprintf("%d.%d", i, n)}
				t0 := time.Now()
				cl.Do(ctx, c.Node(leader).ClientAddr, &op)
				if op.Out.Err != "" || op.Out.Unknown {
					errs++
					continue
				}
				lat = append(lat, float64(time.Since(t0).Microseconds()))
			}
			mu.Lock()
			t.LatenciesUS = append(t.LatenciesUS, lat...)
			t.Errors += errs
			mu.Unlock()
		}()
	}
	wg.Wait()
	t.DurationS = time.Since(start).Seconds()
	t.Writes = len(t.LatenciesUS)
	t.PerSecond = float64(t.Writes) / t.DurationS
	s := slices.Clone(t.LatenciesUS)
	slices.Sort(s)
	if len(s) > 0 {
		t.P50Ms, t.P99Ms, t.MaxMs = bench.Percentile(s, 50)/1000, bench.Percentile(s, 99)/1000, s[len(s)-1]/1000
	}
	o.logf("throughput, %d nodes: %.0f writes/s, p50 %.2f ms, p99 %.2f ms", nodes, t.PerSecond, t.P50Ms, t.P99Ms)
	return t, nil
}

// WriteCharts draws the failover CDF (one line per election timeout) and the write latency
// CDF (one per cluster size) next to result.json.
func WriteCharts(dir string, r *Result) error {
	var errs []error
	if len(r.Failover) > 0 {
		var ss []bench.Series
		for _, f := range r.Failover {
			ss = append(ss, series(fmt.Sprintf("election timeout %.0f ms", f.ElectionTimeoutMs), f.FailoverMs, 1000))
		}
		errs = append(errs, bench.WriteCDF(filepath.Join(dir, "failover"), ss, bench.ChartOptions{
			Title: "failover: kill -9 of the leader -> first acknowledged write"}))
	}
	if len(r.Throughput) > 0 {
		var ss []bench.Series
		for _, t := range r.Throughput {
			ss = append(ss, series(fmt.Sprintf("%d nodes, %d clients", t.Nodes, t.Clients), t.LatenciesUS, 1))
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
