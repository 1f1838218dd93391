package raftbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/raft/offload"
	"github.com/kedge-dev/kedge/internal/raftlab"
)

// Heartbeats: CPU per heartbeat and the heartbeat round trip, kernel paths on and off.

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
