package raftbench

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kedge-dev/kedge/internal/docfigures"
)

// The current raft figures of docs/raft.md and docs/benchmarks.md: one block per committed
// result directory under docs/results, named after it, rendered from its result.json.
var figureRuns = map[string]string{
	// failover and false elections at the fast configuration, under the stress
	"raft-fe-7-s11": "kedge bench raft --scenarios failover,false-elections --tick 1ms --heartbeat-ticks 3 --election-ticks 7 --trials 50 --fe-duration 10m --fe-phases stress --offload on,off --out docs/results/raft-fe-7-s11",
	"raft-fe-7-10":  "kedge bench raft --scenarios failover,false-elections --tick 1ms --heartbeat-ticks 3 --election-ticks 7,10 --trials 50 --fe-duration 10m --fe-phases stress --offload on,off --out docs/results/raft-fe-7-10",
	// failover, throughput and heartbeats at the default configuration, three modes
	"raft-default": "kedge bench raft --scenarios failover,throughput,heartbeat --election-ticks 10 --trials 20 --offload on,follower,off --tp-duration 10s --hb-duration 10s --out docs/results/raft-default",
	// throughput, every mode's writers at once
	"raft-tp-concurrent-12r":    "kedge bench raft --scenarios throughput --tp-concurrent --offload on,on-nowait,off --tp-rounds 12 --tp-duration 20s --out docs/results/raft-tp-concurrent-12r",
	"raft-tp-concurrent-5n-12r": "kedge bench raft --scenarios throughput --tp-concurrent --tp-nodes 5 --offload on,off --tp-rounds 12 --tp-duration 20s --out docs/results/raft-tp-concurrent-5n-12r",
	"raft-tp-fast":              "kedge bench raft --scenarios throughput --tp-concurrent --tick 1ms --heartbeat-ticks 3 --offload on,follower,xdp-pass,off --tp-rounds 6 --tp-duration 20s --out docs/results/raft-tp-fast",
	"raft-tp-fast-onoff":        "kedge bench raft --scenarios throughput --tp-concurrent --tick 1ms --heartbeat-ticks 3 --offload on,off --tp-rounds 6 --tp-duration 20s --out docs/results/raft-tp-fast-onoff",
	// against etcd, side by side in the same lab
	"raft-etcd-tp":          "kedge bench raft --peer etcd --scenarios throughput --offload on --tp-routing leader,spread --tp-rounds 4 --tp-duration 20s --out docs/results/raft-etcd-tp",
	"raft-etcd-tp-spread":   "kedge bench raft --peer etcd --scenarios throughput --offload on --tp-routing spread --tp-rounds 6 --tp-duration 12s --out docs/results/raft-etcd-tp-spread",
	"raft-etcd-tp-leader":   "kedge bench raft --peer etcd --scenarios throughput --offload on --tp-routing leader --tp-rounds 6 --tp-duration 12s --out docs/results/raft-etcd-tp-leader",
	"raft-etcd-failover-10": "kedge bench raft --peer etcd --scenarios failover --offload on --tick 1ms --election-ticks 10 --failover-client leader,uninformed --trials 20 --out docs/results/raft-etcd-failover-10",
	// the failover in blocks (one system's cluster up at a time), four sittings
	"raft-etcd-failover-blocks":   "kedge bench raft --peer etcd --scenarios failover --offload on --tick 1ms --election-ticks 5,10 --failover-client leader,uninformed --trials 20 --out docs/results/raft-etcd-failover-blocks",
	"raft-etcd-failover-blocks-2": "kedge bench raft --peer etcd --scenarios failover --offload on --tick 1ms --election-ticks 5,10 --failover-client leader,uninformed --trials 20 --out docs/results/raft-etcd-failover-blocks-2",
	"raft-etcd-failover-blocks-3": "kedge bench raft --peer etcd --scenarios failover --offload on --tick 1ms --election-ticks 5,10 --failover-client leader,uninformed --trials 20 --out docs/results/raft-etcd-failover-blocks-3",
	"raft-etcd-failover-blocks-4": "kedge bench raft --peer etcd --scenarios failover --offload on --tick 1ms --election-ticks 5,10 --failover-client leader,uninformed --trials 20 --out docs/results/raft-etcd-failover-blocks-4",
	// the closed-connection failover (on) against the build without it (on-noclose) and etcd, in blocks
	"raft-etcd-failover-close-3": "kedge bench raft --peer etcd --scenarios failover --offload on,on-noclose --tick 1ms --election-ticks 5,10 --failover-client leader,uninformed --trials 20 --out docs/results/raft-etcd-failover-close-3",
	"raft-etcd-failover-close-4": "kedge bench raft --peer etcd --scenarios failover --offload on,on-noclose --tick 1ms --election-ticks 5,10 --failover-client leader,uninformed --trials 20 --out docs/results/raft-etcd-failover-close-4",
	// the same, two sittings with no other job on the machine
	"raft-etcd-failover-close-quiet":   "kedge bench raft --peer etcd --scenarios failover --offload on,on-noclose --tick 1ms --election-ticks 5,10 --failover-client leader,uninformed --trials 20 --out docs/results/raft-etcd-failover-close-quiet",
	"raft-etcd-failover-close-quiet-2": "kedge bench raft --peer etcd --scenarios failover --offload on,on-noclose --tick 1ms --election-ticks 5,10 --failover-client leader,uninformed --trials 20 --out docs/results/raft-etcd-failover-close-quiet-2",
	"raft-etcd-failover-50":            "kedge bench raft --peer etcd --scenarios failover --offload on --tick 1ms --election-ticks 50 --failover-client leader,uninformed --trials 20 --out docs/results/raft-etcd-failover-50",
}

// figureNoThroughput are the blocks whose throughput rows stay out: raft-default's are
// sequential 10-second rounds that swung with the machine (VM stalls in three of six); the
// concurrent runs are the throughput figure at that configuration.
var figureNoThroughput = map[string]bool{"raft-default": true}

// FigureBlocks are the raft figure blocks of the documents; tools/docfigures rewrites them.
func FigureBlocks() map[string]docfigures.Block {
	out := map[string]docfigures.Block{}
	for name, cmd := range figureRuns {
		render := Figures
		if figureNoThroughput[name] {
			render = func(dir string) (string, error) { return figures(dir, false) }
		}
		out[name] = docfigures.Block{Results: name, Command: cmd, Render: render}
	}
	out[LadderDir] = docfigures.Block{Results: LadderDir, Command: LadderCommand, Render: LadderFigures}
	return out
}

// ReadResult reads dir/result.json.
func ReadResult(dir string) (*Result, error) {
	var r Result
	if err := docfigures.ReadResult(filepath.Join(dir, "result.json"), Schema, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Figures renders a raft result (dir/result.json) as markdown: the run's configuration,
// then a table per scenario it ran.
func Figures(dir string) (string, error) { return figures(dir, true) }

func figures(dir string, throughput bool) (string, error) {
	r, err := ReadResult(dir)
	if err != nil {
		return "", err
	}
	return renderResult(r, throughput)
}

// renderResult renders one result: its configuration, then a table per scenario it ran.
func renderResult(r *Result, throughput bool) (string, error) {
	var b strings.Builder
	if !throughput {
		r.Throughput, r.ThroughputRuns, r.ThroughputCompare = nil, nil, nil
	}
	fmt.Fprintf(&b, "%s, %s. %s.\n", r.Timestamp.Format(time.DateOnly), r.Describe(), configuration(r))
	if len(r.Failover) > 0 {
		b.WriteString("\n| Mode | Election timeout | Client | Trials | Failover p50 / p99 / max (ms) | More than one election | Detected by the kernel / by closed connections |\n|---|---:|---|---:|---:|---:|---:|\n")
		for _, f := range r.Failover {
			kernel, closed, multi := 0, 0, 0
			for _, p := range f.Phases {
				switch p.Source {
				case "kernel":
					kernel++
				case "close":
					closed++
				}
				if p.Terms > 1 {
					multi++
				}
			}
			detected, elections := fmt.Sprintf("%d / %d of %d", kernel, closed, len(f.Phases)), fmt.Sprintf("%d of %d", multi, len(f.Phases))
			if !kernelPaths(f.Offload) {
				detected = "-"
			}
			if f.Offload == ModeEtcd { // etcd keeps no election record
				elections = "-"
			}
			fmt.Fprintf(&b, "| %s | %.0f ms | %s | %d | %.1f / %.1f / %.1f | %s | %s |\n", f.Offload, f.ElectionTimeoutMs, clientName(f.Client), len(f.FailoverMs)-f.Failed,
				f.P50Ms, f.P99Ms, f.MaxMs, elections, detected)
		}
		b.WriteString(failoverRatios(r.Failover))
		b.WriteString(failoverBlocksTable(r.FailoverBlocks))
		b.WriteString("\nFailover phases of kedge's nodes, p50 / p99 ms (each from the event before; `heard-age`: how old the detecting node's last word from the leader was at the kill):\n\n| Mode | Election timeout | Client |")
		for _, n := range PhaseNames {
			fmt.Fprintf(&b, " %s |", n)
		}
		b.WriteString("\n|---|---:|---|" + strings.Repeat("---:|", len(PhaseNames)) + "\n")
		for _, f := range r.Failover {
			if len(f.Phases) == 0 { // etcd keeps no election record
				continue
			}
			fmt.Fprintf(&b, "| %s | %.0f ms | %s |", f.Offload, f.ElectionTimeoutMs, clientName(f.Client))
			for _, p := range f.PhaseStats {
				fmt.Fprintf(&b, " %.1f / %.1f |", p.P50Ms, p.P99Ms)
			}
			b.WriteString("\n")
		}
	}
	if len(r.FalseElections) > 0 {
		b.WriteString("\n| Mode | Election timeout | Phase | Duration | Leader changes | Term increase |\n|---|---:|---|---:|---:|---:|\n")
		for _, f := range r.FalseElections {
			fmt.Fprintf(&b, "| %s | %.0f ms | %s | %.0f s | %d | %d |\n", f.Offload, f.ElectionTimeoutMs, PhaseName(f), f.DurationS, f.LeaderChanges, f.TermIncrease)
		}
	}
	if len(r.Throughput) > 0 {
		type key struct{ mode, routing string }
		elections := map[key][2]int{} // runs with an election, terms gained
		for _, t := range r.ThroughputRuns {
			e := elections[key{t.Offload, t.Routing}]
			if t.TermChange > 0 {
				e[0]++
			}
			e[1] += int(t.TermChange)
			elections[key{t.Offload, t.Routing}] = e
		}
		b.WriteString("\n| Mode | Nodes | Requests to | Writers | Rounds | Writes/s | p50 (ms) | p99 (ms) | Max (ms) | Failed writes | Rounds with an election (terms gained) |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, t := range r.Throughput {
			e := elections[key{t.Offload, t.Routing}]
			fmt.Fprintf(&b, "| %s | %d | %s | %d | %d | %.0f | %.2f | %.2f | %.1f | %d | %d (%d) |\n", t.Offload, t.Nodes, routingName(t.Routing), t.Clients, t.Rounds,
				t.PerSecond, t.P50Ms, t.P99Ms, t.MaxMs, t.Errors, e[0], e[1])
		}
	}
	if len(r.ThroughputCompare) > 0 {
		b.WriteString("\nPer-round ratios to the baseline, median [min-max] over the rounds, the rounds below 1, and the two-sided sign test of \"below and above 1 equally likely\":\n\n")
		b.WriteString("| Mode / baseline | Requests to | Writes/s | p50 | p99 | Node CPU per write |\n|---|---|---|---|---|---|\n")
		for _, c := range r.ThroughputCompare {
			fmt.Fprintf(&b, "| %s / %s | %s | %s | %s | %s | %s |\n", c.Offload, c.Baseline, routingName(c.Routing), ratioCell(c.PerSecond), ratioCell(c.P50), ratioCell(c.P99), ratioCell(c.NodeCPU))
		}
	}
	if len(r.Heartbeats) > 0 {
		b.WriteString("\n| Mode | Follower CPU per heartbeat | Heartbeats (answered in XDP) | Round trip p50 / p99 (µs) | Leader process CPU | Leader's pacer passes/s |\n|---|---:|---:|---:|---:|---:|\n")
		for _, h := range r.Heartbeats {
			fmt.Fprintf(&b, "| %s | %.1f µs | %d (%d) | %.0f / %.0f | %.0f ms in %.0f s | %.0f |\n", h.Offload, h.CPUPerHBUs, h.Received, h.InXDP,
				h.RTTP50Us, h.RTTP99Us, h.LeaderCPUMs, h.DurationS, h.PacerPassesPerS)
		}
	}
	return b.String(), nil
}

// FailoverRatio is a kedge mode's failover p50 and p99 over etcd's at the same election
// timeout and client.
type FailoverRatio struct {
	Offload           string  `json:"offload"`
	ElectionTimeoutMs float64 `json:"election_timeout_ms"`
	Client            string  `json:"client"`
	P50               float64 `json:"p50"`
	P99               float64 `json:"p99"`
}

// CompareFailover is each kedge mode's failover over etcd's at the same election timeout and
// client (nil without etcd in the run).
func CompareFailover(fs []Failover) []FailoverRatio {
	type key struct {
		et     float64
		client string
	}
	peer := map[key]Failover{}
	for _, f := range fs {
		if f.Offload == ModeEtcd {
			peer[key{f.ElectionTimeoutMs, clientName(f.Client)}] = f
		}
	}
	var out []FailoverRatio
	for _, f := range fs {
		e, ok := peer[key{f.ElectionTimeoutMs, clientName(f.Client)}]
		if f.Offload == ModeEtcd || !ok || e.P50Ms == 0 || e.P99Ms == 0 {
			continue
		}
		out = append(out, FailoverRatio{Offload: f.Offload, ElectionTimeoutMs: f.ElectionTimeoutMs, Client: clientName(f.Client),
			P50: f.P50Ms / e.P50Ms, P99: f.P99Ms / e.P99Ms})
	}
	return out
}

// failoverRatios is a table of each kedge mode's failover p50 and p99 over etcd's at the
// same election timeout and client ("" without etcd in the run).
func failoverRatios(fs []Failover) string {
	var b strings.Builder
	for _, c := range CompareFailover(fs) {
		if b.Len() == 0 {
			b.WriteString("\n| Mode / etcd | Election timeout | Client | Failover p50 | Failover p99 |\n|---|---:|---|---:|---:|\n")
		}
		fmt.Fprintf(&b, "| %s / etcd | %.0f ms | %s | %.2fx | %.2fx |\n", c.Offload, c.ElectionTimeoutMs, c.Client, c.P50, c.P99)
	}
	return b.String()
}

// failoverBlocksTable is a table of a blocked failover run's blocks, in the order run ("" for
// a run without blocks).
func failoverBlocksTable(bs []FailoverBlock) string {
	if len(bs) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\nIn blocks, one system's cluster up at a time (started for its block, stopped after it), the systems alternating; per block and client p50 / p99 ms:\n\n| Block | Mode | Election timeout | Clients: p50 / p99 (ms) | Load at start / end |\n|---:|---|---:|---|---:|\n")
	for _, bl := range bs {
		var cells []string
		for _, c := range bl.Clients {
			cells = append(cells, fmt.Sprintf("%s %d: %.1f / %.1f", clientName(c.Client), len(c.FailoverMs), c.P50Ms, c.P99Ms))
		}
		fmt.Fprintf(&b, "| %d | %s | %.0f ms | %s | %s |\n", bl.Block+1, bl.Offload, bl.ElectionTimeoutMs, strings.Join(cells, "; "), BlockLoad(bl))
	}
	return b.String()
}

// BlockLoad is a failover block's load average (1 min) at its start and end.
func BlockLoad(b FailoverBlock) string {
	if len(b.LoadStart) == 0 || len(b.LoadEnd) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f / %.2f", b.LoadStart[0], b.LoadEnd[0])
}

// PhaseName is a false-election phase, with the writes of a stress-disk run.
func PhaseName(f FalseElections) string {
	if f.Scenario != "stress-disk" {
		return f.Scenario
	}
	return fmt.Sprintf("%s (node %d's disk stalled; %d writes acknowledged, %d failed)", f.Scenario, f.Stalled, f.Writes, f.WriteErrors)
}

// LoadSpan is a false-election run's load average (1 min) at its start and end ("-" for a
// result of before they were kept).
func LoadSpan(f FalseElections) string {
	if len(f.LoadStart) == 0 || len(f.LoadEnd) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f / %.1f", f.LoadStart[0], f.LoadEnd[0])
}

// clientName is a failover client's name in the tables ("" in results of before the
// clients: the leader client).
func clientName(c string) string {
	if c == "" {
		return ClientLeader
	}
	return c
}

// routingName says where a throughput run's requests went.
func routingName(r string) string {
	if r == RouteSpread {
		return "every node in turn"
	}
	return "the leader"
}

// configuration says how the run's clusters were set up, from its parameters.
func configuration(r *Result) string {
	p := r.Parameters
	num := func(k string) float64 { v, _ := p[k].(float64); return v }
	var parts []string
	tick := num("tick_ms")
	hb := num("heartbeat_ticks")
	if hb == 0 {
		hb = 1
	}
	parts = append(parts, fmt.Sprintf("tick %g ms, heartbeat every %g ms", tick, tick*hb))
	var timeouts []string
	if ets, ok := p["election_ticks"].([]any); ok && (len(r.Failover) > 0 || len(r.FalseElections) > 0) {
		for _, et := range ets {
			if v, ok := et.(float64); ok {
				timeouts = append(timeouts, fmt.Sprintf("%g", v*tick))
			}
		}
		parts = append(parts, "election timeout "+strings.Join(timeouts, ", ")+" ms")
	}
	if len(r.ThroughputRuns) > 0 {
		how := "one mode after the other"
		if r.ThroughputRuns[0].Concurrent {
			how = "every mode's writers at once"
		}
		parts = append(parts, fmt.Sprintf("throughput at election timeout %g ms, %g rounds of %g s, %s", 10*tick, num("throughput_rounds"), num("throughput_s"), how))
	}
	if v := num("heartbeat_lease_ms"); v > 0 {
		parts = append(parts, fmt.Sprintf("kernel heartbeats' lease %g ms", v))
	}
	if v := num("offload_alive_ms"); v > 0 {
		parts = append(parts, fmt.Sprintf("alive bound %g ms", v))
	}
	if v := num("failover_block"); v > 0 && len(r.Failover) > 0 {
		parts = append(parts, fmt.Sprintf("failover in blocks of %g trials per client, one system's cluster up at a time", v))
	}
	if v, ok := p["peer"].(string); ok && v != "" {
		parts = append(parts, "peer "+v)
	}
	if auth, ok := p["authenticated"].(bool); ok {
		parts = append(parts, map[bool]string{true: "cluster key on", false: "no cluster key"}[auth])
	}
	if slices.Contains(toStrings(p["scenarios"]), "false-elections") {
		parts = append(parts, fmt.Sprintf("false elections under %s for %g s", strings.Join(toStrings(p["false_phases"]), ", "), num("false_election_s")))
	}
	if nd, _ := p["node_disks"].(bool); nd { // a run of before disk_nodes: every node had one
		parts = append(parts, "each node on a disk of its own (ext4 on a loop device, direct I/O)")
	}
	if dn, _ := p["disk_nodes"].([]any); len(dn) > 0 {
		parts = append(parts, fmt.Sprintf("the stalled node (n%v) on a disk of its own (ext4 on a loop device, direct I/O), the others' data on the VM disk's ext4", dn[0]))
	}
	return strings.Join(parts, "; ")
}

func toStrings(v any) []string {
	l, _ := v.([]any)
	var out []string
	for _, x := range l {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// ratioCell prints a ratio over the rounds: "1.019x [1.003-1.050], 0 of 12 below 1, p = 0.0005".
func ratioCell(x Ratio) string {
	if math.IsNaN(x.Median) || len(x.PerRound) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3fx [%.3f-%.3f], %d of %d below 1, p = %.2g", x.Median, x.Min, x.Max, x.Below, len(x.PerRound), x.SignP)
}
