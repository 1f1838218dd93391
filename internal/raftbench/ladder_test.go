package raftbench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
)

func TestLadderFigures(t *testing.T) {
	dir := t.TempDir()
	params := map[string]any{"tick_ms": 1, "election_ticks": []int{5}, "scenarios": []string{"false-elections"},
		"false_phases": []string{"stress-disk"}, "false_election_s": 600}
	write := func(name string, at time.Time, fe []FalseElections, fo []Failover) {
		t.Helper()
		p := params
		if name == "on-5-lease" { // a configuration of its own
			p = map[string]any{"heartbeat_lease_ms": 400, "offload_alive_ms": 400}
		}
		r := Result{Envelope: bench.NewEnvelope(context.Background(), Schema, "", p), FalseElections: fe, Failover: fo}
		r.Timestamp, r.Commit, r.LoadAvg = at, "0123456789abcdef", nil
		switch name {
		case "etcd-50":
			r.LoadAvg = []float64{9, 8, 7} // the per-phase load stands before the bench's
		case "on-2":
			r.LoadAvg = []float64{2, 1, 1} // a run without the per-phase load: the bench's at its start
		}
		if err := bench.WriteJSON(filepath.Join(dir, name, "result.json"), r); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Date(2026, 11, 29, 17, 0, 0, 0, time.UTC)
	// Written out of order: the table follows the runs' times.
	write("on-2", t0.Add(30*time.Minute), []FalseElections{{Offload: ModeOn, Scenario: "stress-disk", ElectionTimeoutMs: 2, DurationS: 41, LeaderChanges: 1, TermIncrease: 2, UntilChange: true}}, nil)
	write("etcd-50", t0, []FalseElections{{Offload: ModeEtcd, Scenario: "stress-disk", ElectionTimeoutMs: 50, DurationS: 600, Writes: 9000, Stalled: 2,
		LoadStart: []float64{3, 2, 1}, LoadEnd: []float64{4.5, 3, 2},
		WALFsync: &WALFsyncRecord{SlowOverMs: 128, Fsyncs: 300, Slow: 250, MaxLeMs: 1024, OtherFsyncs: 18000, OtherSlow: 0, OtherMaxLeMs: 32}}}, nil)
	write("on-5", t0.Add(15*time.Minute), []FalseElections{{Offload: ModeOn, Scenario: "stress-disk", ElectionTimeoutMs: 5, DurationS: 600, Writes: 12000, Stalled: 3,
		Stall: &StallRecord{AliveBoundMs: 100, SlowSaves: 1500, SaveP50Ms: 340, SaveMaxMs: 480, OtherSlowSaves: 4, OtherSaveMaxMs: 150, Judged: 1400, Late: 0, LateMaybe: 3, LastWordMaxMs: 101, LastWordMaxLateMs: 140}}}, nil)
	write("on-5-lease", t0.Add(40*time.Minute), []FalseElections{{Offload: ModeOn, Scenario: "stress-disk", ElectionTimeoutMs: 5, DurationS: 4, LeaderChanges: 1, UntilChange: true}}, nil)
	write("on-5-adaptive", t0.Add(42*time.Minute), []FalseElections{{Offload: ModeOn, Scenario: "stress-disk", ElectionTimeoutMs: 5, DurationS: 600, Writes: 11000, Stalled: 3,
		Stall: &StallRecord{AliveBoundMs: 100, AliveBoundMaxMs: 640, OtherBoundMaxMs: 1000, SlowSaves: 10, SaveP50Ms: 700, SaveMaxMs: 1500, Judged: 3, LastWordMaxMs: 620, LastWordMaxLateMs: 650}}}, nil)
	write("failover", t0.Add(45*time.Minute), nil, []Failover{{Offload: ModeOn, ElectionTimeoutMs: 5, Client: ClientUninformed, FailoverMs: []float64{9, 11}, P50Ms: 9, P99Ms: 11, MaxMs: 11}})
	got, err := LadderFigures(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| 1 | etcd | 50 ms | 600 s | 0 (0) | 3.0 / 4.5 | 9000 / 0 | - | - | 250 of 300 (1024 ms) / 0 of 18000 (32 ms) | - | 0123456 |",
		"| 2 | on | 5 ms | 600 s | 0 (0) | - | 12000 / 0 | 1500, 340 / 480 ms | 150 ms | - | 1400, 0 (3 maybe); last word at most 101 ms (140 ms) after a save began; bound 100 ms | 0123456 |",
		"| 3 | on | 2 ms | 41 s | 1 (2) | 2.0 / - |",
		"| etcd | 50 ms | 50 ms: quiet | - |",
		"| on | 5 ms | 5 ms: quiet; 2 ms: a change after 41 s | 0.10x |",
		"each run tick 1 ms, heartbeat every 1 ms; false elections under stress-disk for 600 s.",
		"| 4 | on (lease 400 ms, alive bound 400 ms) | 5 ms | 4 s | 1 (0) |",
		"| on (lease 400 ms, alive bound 400 ms) | none of those run | 5 ms: a change after 4 s | - |",
		"| 5 | on (adaptive bound) | 5 ms | 600 s | 0 (0) | - | 11000 / 0 | 10, 700 / 1500 ms | 0 ms | - | 3, 0 (0 maybe); last word at most 620 ms (650 ms) after a save began; bound 100 ms adaptive (at a stalled save up to 640 ms, others' up to 1000 ms) | 0123456 |",
		"| on (adaptive bound) | 5 ms | 5 ms: quiet | 0.10x |",
		"Failover, 2026-11-29",
		"| on | 5 ms | uninformed | 2 | 9.0 / 11.0 / 11.0 |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("ladder figures lack %q:\n%s", want, got)
		}
	}
	if !strings.Contains(got, "| System | Shortest safe timeout (no leader or term change in a whole run of 10 minutes) |") {
		t.Errorf("ladder figures do not name the run length:\n%s", got)
	}
	// A shorter ladder: a run quiet for all of its 5 minutes makes its timeout safe, one
	// that ended early does not.
	short := t.TempDir()
	for i, fe := range []FalseElections{
		{Offload: ModeEtcd, Scenario: "stress-disk", ElectionTimeoutMs: 100, DurationS: 300},
		{Offload: ModeOn, Scenario: "stress-disk", ElectionTimeoutMs: 20, DurationS: 120, LeaderChanges: 1, UntilChange: true},
	} {
		r := Result{Envelope: bench.NewEnvelope(context.Background(), Schema, "", map[string]any{"false_election_s": 300}), FalseElections: []FalseElections{fe}}
		r.Timestamp = t0.Add(time.Duration(i) * 10 * time.Hour) // the second run on the next day, on another kernel
		r.Kernel = fmt.Sprint("6.18.", i+1)
		if err := bench.WriteJSON(filepath.Join(short, fe.Offload, "result.json"), r); err != nil {
			t.Fatal(err)
		}
	}
	got, err = LadderFigures(short)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"(no leader or term change in a whole run of 5 minutes)", "| etcd | 100 ms | 100 ms: quiet | - |", "| on | none of those run | 20 ms: a change after 120 s | - |",
		"2026-11-29 17:00 to 2026-11-30 03:00 UTC, kernels 6.18.1 (run 1), 6.18.2 (run 2),"} {
		if !strings.Contains(got, want) {
			t.Errorf("short ladder figures lack %q:\n%s", want, got)
		}
	}
	if _, err := LadderFigures(t.TempDir()); err == nil {
		t.Error("an empty ladder: no error")
	}
}

// TestWALFsyncRecord: the run's fsyncs are the difference of two cumulative readings; the
// longest is the upper bound of the highest bucket that gained one, slow is over the first
// bound of at least 100 ms; the stalled node is apart from the others.
func TestWALFsyncRecord(t *testing.T) {
	inf := math.Inf(1)
	before := map[int]fsyncHist{
		1: {0.001: 10, 0.128: 10, 0.256: 10, inf: 10},
		2: {0.001: 5, 0.128: 5, 0.256: 6, inf: 6},
		3: {0.001: 0, 0.128: 0, 0.256: 0, inf: 0},
	}
	after := map[int]fsyncHist{
		1: {0.001: 20, 0.128: 30, 0.256: 30, inf: 30}, // 20 more, the longest <= 128 ms
		2: {0.001: 5, 0.128: 6, 0.256: 9, inf: 10},    // 4 more: 1 <= 128, 2 <= 256, 1 beyond
		3: {0.001: 7, 0.128: 7, 0.256: 7, inf: 7},     // 7, all <= 1 ms
	}
	got := walFsyncRecord(before, after, 2)
	want := WALFsyncRecord{SlowOverMs: 128, Fsyncs: 4, Slow: 3, MaxLeMs: 256, MaxBeyond: true, OtherFsyncs: 27, OtherSlow: 0, OtherMaxLeMs: 128}
	if got == nil || *got != want {
		t.Errorf("record %+v, want %+v", got, want)
	}
	// The record encodes (JSON has no infinity: a fsync beyond the last bound is flagged).
	if _, err := json.Marshal(got); err != nil {
		t.Errorf("encode the record: %v", err)
	}
	delete(after, 3)
	if r := walFsyncRecord(before, after, 2); r != nil {
		t.Errorf("a node missing from one reading: %+v, want nil", r)
	}
}
