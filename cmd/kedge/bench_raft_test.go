package main

import (
	"strings"
	"testing"

	"github.com/kedge-dev/kedge/internal/raftbench"
)

// TestRaftBenchThroughputTable: the throughput tables print every run in order, each round's
// ratio to off and the summary over the rounds, from the figures in the result.
func TestRaftBenchThroughputTable(t *testing.T) {
	run := func(round int, mode string, perS, p50, p99 float64) raftbench.ThroughputRun {
		return raftbench.ThroughputRun{Round: round, Offload: mode, Nodes: 3, Clients: 16,
			WriteStats: raftbench.WriteStats{PerSecond: perS, P50Ms: p50, P99Ms: p99, Writes: int(perS)},
			NodeCPUUs:  400, MachineCPUUs: 900}
	}
	r := &raftbench.Result{ThroughputRuns: []raftbench.ThroughputRun{
		run(0, raftbench.ModeOn, 900, 5.5, 11), run(0, raftbench.ModeOff, 1000, 5, 10),
		run(1, raftbench.ModeOff, 1000, 5, 10), run(1, raftbench.ModeOn, 950, 5, 12),
	}}
	r.ThroughputRuns[0].KernelHeartbeatsPerS, r.ThroughputRuns[0].PacerPassesPerS = 200, 201
	r.ThroughputRuns[1].TermChange = 1
	modes := []string{raftbench.ModeOn, raftbench.ModeOff}
	r.ThroughputCompare = raftbench.CompareThroughput(r.ThroughputRuns, modes)
	var b strings.Builder
	if err := raftBenchTable(&b, r); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"THROUGHPUT RUNS", "THROUGHPUT PER ROUND", "THROUGHPUT RATIO",
		"200/s, 201 passes/s", // mode on's kernel heartbeats
		"0.900x", "0.950x",    // writes/s per round
		"1.100x", "1.200x", // p99 per round
		"0.925x [0.900-0.950]", // writes/s: median [min-max]
		"2 below 1, p=0.50",    // both rounds below: the sign test of 2
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	// Runs in the order run, the term change of round 1's off run in its row.
	lines := strings.Split(out, "\n")
	var rows []string
	for _, l := range lines[1:5] {
		rows = append(rows, strings.Join(strings.Fields(l)[:4], " "))
	}
	if got := strings.Join(rows, "|"); got != "3 nodes 1 on|3 nodes 1 off|3 nodes 2 off|3 nodes 2 on" {
		t.Errorf("run rows %q", got)
	}
	if f := strings.Fields(lines[2]); f[len(f)-1] != "1" {
		t.Errorf("round 1 off row does not end in its term change 1: %q", lines[2])
	}
}

// TestRaftBenchThroughputTableConcurrent: runs whose writers ran at the same time print no
// machine figures (they are not one cluster's) and no machine ratio.
func TestRaftBenchThroughputTableConcurrent(t *testing.T) {
	run := func(mode string, perS, cpu float64) raftbench.ThroughputRun {
		return raftbench.ThroughputRun{Offload: mode, Nodes: 3, Clients: 16, Concurrent: true,
			WriteStats: raftbench.WriteStats{PerSecond: perS, P50Ms: 5, P99Ms: 10, Writes: int(perS)}, NodeCPUUs: cpu}
	}
	r := &raftbench.Result{ThroughputRuns: []raftbench.ThroughputRun{run(raftbench.ModeOn, 970, 412), run(raftbench.ModeOff, 1000, 400)}}
	r.ThroughputCompare = raftbench.CompareThroughput(r.ThroughputRuns, []string{raftbench.ModeOn, raftbench.ModeOff})
	var b strings.Builder
	if err := raftBenchTable(&b, r); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.Contains(out, "NaN") {
		t.Errorf("table prints NaN:\n%s", out)
	}
	for _, want := range []string{"0.970x", "1.030x"} { // writes/s and node CPU per write
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	lines := strings.Split(out, "\n")
	// THROUGHPUT RUNS rows: node CPU, then "-" for the machine and its softirq.
	if f := strings.Fields(lines[1]); len(f) < 17 || f[13] != "412" || f[15] != "-" || f[16] != "-" {
		t.Errorf("concurrent run row does not leave the machine's figures out: %q", lines[1])
	}
	var ratioRow string
	for _, l := range lines {
		if strings.Contains(l, "on / off") && strings.Contains(l, "below 1") {
			ratioRow = l
		}
	}
	if !strings.HasSuffix(strings.TrimSpace(ratioRow), "-") {
		t.Errorf("ratio row has a machine CPU ratio: %q", ratioRow)
	}
}
