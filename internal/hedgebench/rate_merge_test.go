package hedgebench

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kedge-dev/kedge/internal/bench"
)

// TestMergeRate: two holds of two rounds become one result of four rounds, the ratios paired
// within each round and their median taken over all four; a hold of another binary is refused.
func TestMergeRate(t *testing.T) {
	root := t.TempDir()
	hold := func(name, commit string, stored ...float64) string {
		env := bench.NewEnvelope(context.Background(), RateSchema, Rate, map[string]any{"n": 100, "rounds": len(stored), "levels": []int{64}})
		env.Commit = commit
		r := RateResult{Envelope: env, Backend: "conveyor", Arms: []string{ArmUnhedged, ArmStored},
			IdleCPU: map[string]float64{ArmUnhedged: 0, ArmStored: 0.02}, Levels: []RateLevel{{Concurrency: 64}},
			Prog: []ProgTime{{Arm: ArmStored, Requests: 10, SplitNS: 500, RespNS: 300, Counters: map[string]uint64{"stored": 10}}}}
		for i, s := range stored {
			r.Runs = append(r.Runs,
				RateRun{Concurrency: 64, Round: i + 1, Arm: ArmUnhedged, Service: "fast", RPS: 1000},
				RateRun{Concurrency: 64, Round: i + 1, Arm: ArmStored, Service: "fast", RPS: s})
		}
		dir := filepath.Join(root, name)
		if err := bench.WriteJSON(filepath.Join(dir, "result.json"), r); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	a, b := hold("a", "c1", 900, 1000), hold("b", "c1", 950, 1100)
	res, err := MergeRate([]string{a, b}, filepath.Join(root, "out"))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 8 || res.Runs[7].Round != 4 || res.Parameters["rounds"] != 4 {
		t.Fatalf("%d runs, last round %d, rounds %v: want 8, 4, 4", len(res.Runs), res.Runs[7].Round, res.Parameters["rounds"])
	}
	st, ok := armAt(res.Levels[0], ArmStored)
	if !ok || st.RPSRatio.N != 4 || st.RPSRatio.Min != 0.9 || st.RPSRatio.Max != 1.1 || st.RPSRatio.Median != 0.975 {
		t.Errorf("stored ratio %+v: want median 0.975 over 4 rounds, 0.9..1.1", st.RPSRatio)
	}
	if len(res.Prog) != 1 || res.Prog[0].Requests != 20 || res.Prog[0].Counters["stored"] != 20 {
		t.Errorf("programs %+v: want one stored entry of both holds' 20 requests", res.Prog)
	}
	var back RateResult
	if err := bench.ReadJSON(filepath.Join(root, "out", "result.json"), &back); err != nil {
		t.Fatal(err)
	}
	if h := holdsNote(back); !strings.Contains(h, "4 rounds in 2 holds") {
		t.Errorf("holds note %q", h)
	}
	if _, err := MergeRate([]string{a, hold("c", "c2", 1000)}, filepath.Join(root, "bad")); err == nil {
		t.Error("merged holds of two binaries")
	}
}
