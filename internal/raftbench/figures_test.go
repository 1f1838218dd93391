package raftbench

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kedge-dev/kedge/internal/bench"
)

func TestFigures(t *testing.T) {
	dir := t.TempDir()
	r := Result{Envelope: bench.NewEnvelope(context.Background(), Schema, "", map[string]any{
		"tick_ms": 1, "heartbeat_ticks": 3, "election_ticks": []int{7}, "authenticated": true,
		"scenarios": []string{"failover", "false-elections", "throughput"}, "false_phases": []string{"stress"}, "false_election_s": 600,
		"throughput_rounds": 2, "throughput_s": 20, "peer": "etcd 3.4.23",
	})}
	r.Failover = []Failover{{Offload: ModeOn, ElectionTimeoutMs: 7, FailoverMs: []float64{10, 12}, P50Ms: 11, P99Ms: 12, MaxMs: 12,
		Phases:     []Phase{{Source: "kernel", Terms: 1}, {Source: "raft", Terms: 2}, {Source: "close", Terms: 1}},
		PhaseStats: []PhaseStats{{Name: "detect", P50Ms: 8, P99Ms: 9}}},
		// etcd keeps no election record: no phases, no elections counted
		{Offload: ModeEtcd, ElectionTimeoutMs: 7, Client: ClientUninformed, FailoverMs: []float64{20}, P50Ms: 20, P99Ms: 20, MaxMs: 20,
			PhaseStats: []PhaseStats{{Name: "detect"}}}, // written by an older bench: no phases, empty statistics
		{Offload: ModeOn, ElectionTimeoutMs: 7, Client: ClientUninformed, FailoverMs: []float64{10, 14}, P50Ms: 12, P99Ms: 14, MaxMs: 14}}
	r.FalseElections = []FalseElections{{Offload: ModeOff, Scenario: "stress", ElectionTimeoutMs: 7, DurationS: 600, LeaderChanges: 3, TermIncrease: 4}}
	r.ThroughputRuns = []ThroughputRun{{Concurrent: true, Offload: ModeOff, TermChange: 1}, {Concurrent: true, Offload: ModeOff, Round: 1}}
	r.Throughput = []Throughput{{Offload: ModeOff, Nodes: 3, Clients: 16, Rounds: 2, WriteStats: WriteStats{PerSecond: 1700, P50Ms: 8.3, P99Ms: 25.7, MaxMs: 71.4, Errors: 150}}}
	r.ThroughputCompare = []ThroughputCompare{{Offload: ModeOn, Baseline: ModeOff, PerSecond: newRatio([]float64{1.01, 1.03})}}
	if err := bench.WriteJSON(filepath.Join(dir, "result.json"), r); err != nil {
		t.Fatal(err)
	}
	got, err := Figures(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"tick 1 ms, heartbeat every 3 ms; election timeout 7 ms; throughput at election timeout 10 ms, 2 rounds of 20 s, every mode's writers at once; peer etcd 3.4.23; cluster key on; false elections under stress for 600 s.",
		"| on | 7 ms | leader | 2 | 11.0 / 12.0 / 12.0 | 1 of 3 | 1 / 1 of 3 |",
		"| etcd | 7 ms | uninformed | 1 | 20.0 / 20.0 / 20.0 | - | - |",
		"| on | 7 ms | leader | 8.0 / 9.0 |",
		"| on / etcd | 7 ms | uninformed | 0.60x | 0.70x |",
		"| off | 7 ms | stress | 600 s | 3 | 4 |",
		"| off | 3 | the leader | 16 | 2 | 1700 | 8.30 | 25.70 | 71.4 | 150 | 1 (1) |",
		"| on / off | the leader | 1.020x [1.010-1.030], 0 of 2 below 1, p = 0.5 |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("figures lack %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "| etcd | 7 ms | uninformed |  |") || strings.Count(got, "| etcd |") != 1 {
		t.Errorf("etcd has a phase row:\n%s", got)
	}
	quiet, err := figures(dir, false)
	if err != nil || strings.Contains(quiet, "1700") || strings.Contains(quiet, "rounds of 20 s") {
		t.Errorf("without throughput (%v):\n%s", err, quiet)
	}
	if _, err := Figures(t.TempDir()); err == nil {
		t.Error("no result.json: no error")
	}
}
