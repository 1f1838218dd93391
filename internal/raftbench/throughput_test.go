package raftbench

import (
	"encoding/json"
	"math"
	"slices"
	"testing"
)

func TestRoundOrder(t *testing.T) {
	modes := []string{ModeOn, ModeFollower, ModeOff}
	for r, want := range [][]string{
		{ModeOn, ModeFollower, ModeOff},
		{ModeOff, ModeFollower, ModeOn},
		{ModeOn, ModeFollower, ModeOff},
		{ModeOff, ModeFollower, ModeOn},
	} {
		if got := roundOrder(modes, r); !slices.Equal(got, want) {
			t.Errorf("round %d: %v, want %v", r, got, want)
		}
	}
	if !slices.Equal(modes, []string{ModeOn, ModeFollower, ModeOff}) {
		t.Errorf("roundOrder changed its argument: %v", modes)
	}
	// Over two rounds, each of two modes runs first once: on,off / off,on.
	first := map[string]int{}
	for r := range 6 {
		first[roundOrder([]string{ModeOn, ModeOff}, r)[0]]++
	}
	if first[ModeOn] != 3 || first[ModeOff] != 3 {
		t.Errorf("first in 6 rounds: %v, want 3 each", first)
	}
}

func TestBaselineMode(t *testing.T) {
	for _, tc := range []struct {
		modes []string
		want  string
	}{
		{[]string{ModeOn, ModeOff}, ModeOff},
		{[]string{ModeOff, ModeOn}, ModeOff},
		{[]string{ModeOn, ModeFollower}, ModeFollower},
		{[]string{ModeOn}, ModeOn},
		{[]string{ModeOn, ModeOff, ModeEtcd}, ModeEtcd},
		{[]string{ModeEtcd, ModeOn}, ModeEtcd},
	} {
		if got := baselineMode(tc.modes); got != tc.want {
			t.Errorf("baselineMode(%v) = %s, want %s", tc.modes, got, tc.want)
		}
	}
}

func TestSignTestP(t *testing.T) {
	for _, tc := range []struct {
		below, above int
		want         float64
	}{
		{0, 0, 1},
		{6, 0, 2.0 / 64},         // all six on one side
		{0, 6, 2.0 / 64},         // symmetric
		{5, 1, 2 * 7.0 / 64},     // (1 + 6) / 64, doubled
		{3, 3, 1},                // capped at 1
		{8, 0, 2.0 / 256},        // eight rounds
		{7, 1, 2 * 9.0 / 256},    // (1 + 8) / 256, doubled
		{10, 2, 2 * 79.0 / 4096}, // (1 + 12 + 66) / 4096, doubled
	} {
		if got := signTestP(tc.below, tc.above); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("signTestP(%d, %d) = %v, want %v", tc.below, tc.above, got, tc.want)
		}
	}
}

func TestNewRatio(t *testing.T) {
	r := newRatio([]float64{0.9, 1.0, 0.95, 1.05, math.NaN(), 0.85})
	if r.Min != 0.85 || r.Max != 1.05 {
		t.Errorf("min-max %v-%v, want 0.85-1.05", r.Min, r.Max)
	}
	if r.Below != 3 || r.Above != 1 { // 1.0 is a tie, NaN is neither
		t.Errorf("below %d above %d, want 3 and 1", r.Below, r.Above)
	}
	if r.SignP != signTestP(3, 1) {
		t.Errorf("sign p %v, want %v", r.SignP, signTestP(3, 1))
	}
	if !math.IsNaN(r.Median) { // a NaN round makes the median unknown rather than wrong
		t.Errorf("median with a NaN round = %v, want NaN", r.Median)
	}
	if r := newRatio([]float64{0.9, 1.1}); math.Abs(r.Median-1) > 1e-12 || r.SignP != 1 {
		t.Errorf("median %v p %v, want 1 and 1", r.Median, r.SignP)
	}
}

func run(round int, mode string, nodes int, perS, p50, p99, cpu float64) ThroughputRun {
	return ThroughputRun{Round: round, Offload: mode, Nodes: nodes, WriteStats: WriteStats{PerSecond: perS, P50Ms: p50, P99Ms: p99},
		NodeCPUUs: cpu, MachineCPUUs: 2 * cpu}
}

func TestCompareThroughputPairsByRound(t *testing.T) {
	// Run order on,off / off,on / on,off (as roundOrder makes it); the last round's
	// baseline run is missing (cut short): that round is left out, not paired with another.
	runs := []ThroughputRun{
		run(0, ModeOn, 3, 900, 5, 10, 300), run(0, ModeOff, 3, 1000, 4, 8, 330),
		run(1, ModeOff, 3, 2000, 2, 4, 300), run(1, ModeOn, 3, 2200, 1, 2, 270),
		run(2, ModeOn, 3, 1, 1, 1, 1),
		run(0, ModeOn, 5, 500, 1, 1, 100), run(0, ModeOff, 5, 400, 1, 1, 100),
	}
	got := CompareThroughput(runs, []string{ModeOn, ModeOff})
	if len(got) != 2 {
		t.Fatalf("%d comparisons, want 2 (3 and 5 nodes): %+v", len(got), got)
	}
	c := got[0]
	if c.Offload != ModeOn || c.Baseline != ModeOff || c.Nodes != 3 || c.Rounds != 2 {
		t.Fatalf("comparison %+v, want on / off, 3 nodes, 2 rounds", c)
	}
	want := func(name string, r Ratio, per []float64) {
		t.Helper()
		if len(r.PerRound) != len(per) {
			t.Fatalf("%s: %v, want %v", name, r.PerRound, per)
		}
		for i := range per {
			if math.Abs(r.PerRound[i]-per[i]) > 1e-12 {
				t.Errorf("%s round %d: %v, want %v", name, i, r.PerRound[i], per[i])
			}
		}
	}
	want("writes/s", c.PerSecond, []float64{0.9, 1.1})
	want("p50", c.P50, []float64{1.25, 0.5})
	want("p99", c.P99, []float64{1.25, 0.5})
	want("node cpu", c.NodeCPU, []float64{300.0 / 330, 0.9})
	if c.MachineCPU == nil {
		t.Fatal("no machine CPU ratio for runs one after the other")
	}
	want("machine cpu", *c.MachineCPU, []float64{300.0 / 330, 0.9})
	if math.Abs(c.PerSecond.Median-1.0) > 1e-12 {
		t.Errorf("median writes/s ratio %v, want 1.0", c.PerSecond.Median)
	}
	if got[1].Nodes != 5 || got[1].Rounds != 1 || got[1].PerSecond.PerRound[0] != 1.25 {
		t.Errorf("5-node comparison %+v, want one round of 1.25x", got[1])
	}
	// Three modes: each non-baseline mode against off.
	three := append(runs[:2:2], run(0, ModeFollower, 3, 950, 4, 8, 320))
	got = CompareThroughput(three, []string{ModeOn, ModeFollower, ModeOff})
	if len(got) != 2 || got[0].Offload != ModeOn || got[1].Offload != ModeFollower || got[1].PerSecond.PerRound[0] != 0.95 {
		t.Errorf("three modes: %+v", got)
	}
	if CompareThroughput(runs, nil) != nil {
		t.Error("comparison without modes")
	}
	// Concurrent runs: paired by round as well, but the machine's CPU is not one
	// cluster's: no ratio of it (and nothing that JSON cannot encode).
	con := []ThroughputRun{run(0, ModeOn, 3, 900, 5, 10, 300), run(0, ModeOff, 3, 1000, 4, 8, 330)}
	for i := range con {
		con[i].Concurrent, con[i].MachineCPUUs = true, 0
	}
	got = CompareThroughput(con, []string{ModeOn, ModeOff})
	if len(got) != 1 || got[0].MachineCPU != nil || got[0].PerSecond.PerRound[0] != 0.9 {
		t.Errorf("concurrent: %+v, want writes/s 0.9x and no machine CPU ratio", got)
	}
	if _, err := json.Marshal(got); err != nil {
		t.Errorf("concurrent comparison does not encode: %v", err)
	}
	// Two routings in the same rounds: each run is paired with the baseline's run of its
	// own routing, never the other's.
	routed := func(r ThroughputRun, routing string) ThroughputRun { r.Routing = routing; return r }
	two := []ThroughputRun{
		routed(run(0, ModeOn, 3, 900, 5, 10, 300), RouteLeader), routed(run(0, ModeEtcd, 3, 1000, 4, 8, 330), RouteLeader),
		routed(run(0, ModeOn, 3, 600, 5, 10, 300), RouteSpread), routed(run(0, ModeEtcd, 3, 500, 4, 8, 330), RouteSpread),
	}
	got = CompareThroughput(two, []string{ModeOn, ModeEtcd})
	if len(got) != 2 || got[0].Routing != RouteLeader || got[0].Baseline != ModeEtcd || got[0].PerSecond.PerRound[0] != 0.9 ||
		got[1].Routing != RouteSpread || got[1].PerSecond.PerRound[0] != 1.2 {
		t.Errorf("two routings: %+v, want to the leader 0.9x and spread 1.2x against etcd", got)
	}
	if pooled := poolThroughput(two, []string{ModeOn, ModeEtcd}); len(pooled) != 4 || pooled[2].Routing != RouteSpread || pooled[2].Writes != two[2].Writes {
		t.Errorf("two routings pooled: %+v, want 4 groups, the third on spread", pooled)
	}
}

func TestPoolThroughput(t *testing.T) {
	a := ThroughputRun{Round: 0, Offload: ModeOn, Nodes: 3, Clients: 4, WriteStats: WriteStats{DurationS: 2, Writes: 4, Errors: 1}, LatenciesUS: []float64{4000, 1000, 3000, 2000}}
	b := ThroughputRun{Round: 1, Offload: ModeOn, Nodes: 3, Clients: 4, WriteStats: WriteStats{DurationS: 2, Writes: 2}, LatenciesUS: []float64{6000, 5000}}
	c := ThroughputRun{Round: 0, Offload: ModeOff, Nodes: 3, Clients: 4, WriteStats: WriteStats{DurationS: 1, Writes: 1}, LatenciesUS: []float64{7000}}
	got := poolThroughput([]ThroughputRun{a, c, b}, []string{ModeOn, ModeOff})
	if len(got) != 2 {
		t.Fatalf("%d pooled, want 2: %+v", len(got), got)
	}
	on := got[0]
	if on.Offload != ModeOn || on.Rounds != 2 || on.Writes != 6 || on.Errors != 1 || on.DurationS != 4 || on.PerSecond != 1.5 {
		t.Errorf("pooled on %+v: want 2 rounds, 6 writes, 1 error, 4 s, 1.5/s", on)
	}
	if on.P50Ms != 3 || on.P99Ms != 6 || on.MaxMs != 6 || !slices.IsSorted(on.LatenciesUS) {
		t.Errorf("pooled on p50 %v p99 %v max %v latencies %v: want 3, 6, 6 ms, sorted", on.P50Ms, on.P99Ms, on.MaxMs, on.LatenciesUS)
	}
	if got[1].Offload != ModeOff || got[1].Rounds != 1 || got[1].PerSecond != 1 {
		t.Errorf("pooled off %+v", got[1])
	}
}

func TestThin(t *testing.T) {
	v := make([]float64, 1001)
	for i := range v {
		v[i] = float64(i)
	}
	got := thin(v, 11)
	if !slices.Equal(got, []float64{0, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000}) {
		t.Errorf("thin 1001 to 11: %v", got)
	}
	if got := thin(v[:5], 11); len(got) != 5 {
		t.Errorf("thin of fewer than n kept %d", len(got))
	}
}
