package raftbench

import (
	"strings"
	"testing"
)

// TestBlockSchedule: the modes alternate block by block (never two blocks of one mode in a
// row), every mode gets exactly its trials, and a block size that does not divide the trials
// leaves the remainder to the last blocks.
func TestBlockSchedule(t *testing.T) {
	for _, tc := range []struct {
		modes         []string
		trials, size  int
		wantBlocks    int
		wantLastTrial int
	}{
		{[]string{ModeOn, ModeEtcd}, 20, 5, 8, 5},
		{[]string{ModeOn, ModeEtcd}, 20, 6, 8, 2},
		{[]string{ModeOn, ModeEtcd}, 3, 10, 2, 3},
		{[]string{ModeOn, ModeOff, ModeEtcd}, 7, 2, 12, 1},
		{[]string{ModeEtcd}, 4, 2, 2, 2},
	} {
		s := blockSchedule(tc.modes, tc.trials, tc.size)
		if len(s) != tc.wantBlocks {
			t.Errorf("%v %d/%d: %d blocks, want %d: %v", tc.modes, tc.trials, tc.size, len(s), tc.wantBlocks, s)
			continue
		}
		got := map[string]int{}
		for i, b := range s {
			if b.Mode != tc.modes[i%len(tc.modes)] {
				t.Errorf("%v %d/%d: block %d runs %s, want %s (the modes in turn): %v", tc.modes, tc.trials, tc.size, i, b.Mode, tc.modes[i%len(tc.modes)], s)
			}
			if len(tc.modes) > 1 && i > 0 && s[i-1].Mode == b.Mode {
				t.Errorf("%v: blocks %d and %d both %s", tc.modes, i-1, i, b.Mode)
			}
			if b.Trials < 1 || b.Trials > tc.size {
				t.Errorf("%v %d/%d: block %d has %d trials", tc.modes, tc.trials, tc.size, i, b.Trials)
			}
			got[b.Mode] += b.Trials
		}
		for _, m := range tc.modes {
			if got[m] != tc.trials {
				t.Errorf("%v %d/%d: mode %s gets %d trials, want %d", tc.modes, tc.trials, tc.size, m, got[m], tc.trials)
			}
		}
		if last := s[len(s)-1].Trials; last != tc.wantLastTrial {
			t.Errorf("%v %d/%d: last block %d trials, want %d", tc.modes, tc.trials, tc.size, last, tc.wantLastTrial)
		}
	}
	if s := blockSchedule([]string{ModeOn, ModeEtcd}, 10, 0); len(s) != 0 {
		t.Errorf("block size 0: %v, want no blocks (the run without blocks)", s)
	}
}

// TestFailoverBlocksFigures: a blocked run's figures carry each block in order with its
// clients' p50 / p99 and load, the ratios to etcd and the block size in the configuration.
func TestFailoverBlocksFigures(t *testing.T) {
	r := &Result{Failover: []Failover{
		{Offload: ModeOn, ElectionTimeoutMs: 10, Client: ClientUninformed, FailoverMs: []float64{10, 20}, P50Ms: 15, P99Ms: 20},
		{Offload: ModeEtcd, ElectionTimeoutMs: 10, Client: ClientUninformed, FailoverMs: []float64{30, 40}, P50Ms: 30, P99Ms: 40},
	}, FailoverBlocks: []FailoverBlock{
		{Block: 0, Offload: ModeOn, ElectionTimeoutMs: 10, LoadStart: []float64{0.5}, LoadEnd: []float64{0.75},
			Clients: []BlockClient{{Client: ClientUninformed, FailoverMs: []float64{10, 20}, P50Ms: 15, P99Ms: 20}}},
		{Block: 1, Offload: ModeEtcd, ElectionTimeoutMs: 10, LoadStart: []float64{0.75}, LoadEnd: []float64{1},
			Clients: []BlockClient{{Client: ClientUninformed, FailoverMs: []float64{30, 40}, P50Ms: 30, P99Ms: 40}}},
	}}
	r.Parameters = map[string]any{"tick_ms": 1.0, "failover_block": 5.0}
	out, err := renderResult(r, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"failover in blocks of 5 trials per client",
		"| on / etcd | 10 ms | uninformed | 0.50x | 0.50x |",
		"| 1 | on | 10 ms | uninformed 2: 15.0 / 20.0 | 0.50 / 0.75 |",
		"| 2 | etcd | 10 ms | uninformed 2: 30.0 / 40.0 | 0.75 / 1.00 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("figures lack %q:\n%s", want, out)
		}
	}
}
