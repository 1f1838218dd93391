package hedgebench

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/docfigures"
)

func TestUpdateFiguresFromResults(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "hedge")
	rate := RateResult{Envelope: bench.NewEnvelope(context.Background(), RateSchema, Rate, map[string]any{"n": 30000, "rounds": 5, "stall_pct": 2, "stall_ms": 50}),
		Backend: "conveyor", Arms: []string{ArmUnhedged, ArmClone}, StoredArm: "not run: test", IdleCPU: map[string]float64{ArmUnhedged: 0, ArmClone: 0.02},
		Levels: []RateLevel{
			{Concurrency: 1, Arms: []ArmLevel{{Arm: ArmUnhedged, RPS: 9000}, {Arm: ArmClone, RPS: 8000, DeltaP50US: Paired{17, 15, 20, 5, 0, 0, 0}}}},
			{Concurrency: 64, Arms: []ArmLevel{{Arm: ArmUnhedged, RPS: 59000}, {Arm: ArmClone, RPS: 35000, RPSRatio: Paired{0.6, 0.55, 0.7, 5, 0, 0, 0}, ProcCPUAddedUS: Paired{18, 16, 20, 5, 0, 0, 0}}}},
		},
		Prog: []ProgTime{{Arm: ArmClone, Requests: 2000, SplitNS: 1500, RespNS: 330, Counters: map[string]uint64{"clones": 2000}}}}
	if err := bench.WriteJSON(filepath.Join(dir, Rate, "result.json"), rate); err != nil {
		t.Fatal(err)
	}
	gc := bench.Result{Envelope: bench.NewEnvelope(context.Background(), bench.SchemaVersion, GC, map[string]any{
		"stall_pct": 2, "hedge_delay_ms": 10,
		"pause_schedule": PauseSchedule{Seed: 1, Coverage: 0.03, MinMS: 5, MaxMS: 50, Pauses: []Pause{{At: time.Second, Len: 20 * time.Millisecond}}},
		"pause_runs":     map[string]PauseRun{"kernel-hedged": {ElapsedMS: 1000, Pauses: 1, Coverage: 0.02}},
	})}
	for _, name := range []string{"baseline", "kernel-hedged"} {
		// ids 100..299: 100, 101, 200, 201 stall (2%); the kernel rescues them at 12.3 ms.
		s := series(100, 200, func(id uint32) (float64, bool) {
			if id%100 < 2 {
				return map[string]float64{"baseline": 400000, "kernel-hedged": 12300}[name], true
			}
			return 2000, true
		})
		s.Name = name
		gc.Series = append(gc.Series, s)
	}
	if err := gc.WriteFile(filepath.Join(dir, GC, "result.json")); err != nil {
		t.Fatal(err)
	}
	doc := []byte("# T\n\n<!-- figures:hedge-targets -->\nold\n<!-- /figures -->\ntext\n<!-- figures:hedge-rate -->\n<!-- /figures -->\n" +
		"<!-- figures:hedge-gc -->\nx\n<!-- /figures -->\n<!-- figures:hedge-pressure -->\nstale 1.23\n<!-- /figures -->\nend\n")
	out, names, err := docfigures.Update(doc, root, FigureBlocks())
	if err != nil {
		t.Fatal(err)
	}
	got := string(out)
	if len(names) != 4 || !strings.HasPrefix(got, "# T\n\n<!-- figures:hedge-targets -->\n") || !strings.HasSuffix(got, "<!-- /figures -->\nend\n") || !strings.Contains(got, "\ntext\n") {
		t.Fatalf("blocks %v, document:\n%s", names, got)
	}
	for _, want := range []string{
		"| clone | 0.60x (0.55x..0.70x) (missed by 0.35x) | +18.0 (+16.0..+20.0) (missed by 15.0 µs) | - | +17.0 (+15.0..+20.0) (missed by 9.0 µs) |",
		"| stored | - | - | - | - |",
		"| 64 | clone | 35000 | 0.60x (0.55x..0.70x) |",
		"hedge_split 1500 ns, hedge_resp 330 ns (clones 2000)",
		"| kernel-hedged |     2.00 |     2.00 |    12.30 |",
		"kernel-hedged: hedge excess on 4 stalled requests P50 0.30 ms",
		"seed 1, 5-50 ms, 3.0% of the time planned",
		"_Not run yet: no docs/results/hedge/pressure/summary.json (run `kedge bench hedge --scenario pressure",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("document lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "old") || strings.Contains(got, "stale 1.23") {
		t.Errorf("old block text left:\n%s", got)
	}
	// Idempotent: a second pass changes nothing.
	again, _, err := docfigures.Update(out, root, FigureBlocks())
	if err != nil || !bytes.Equal(again, out) {
		t.Errorf("second pass changed the document (%v)", err)
	}
	if _, _, err := docfigures.Update([]byte("<!-- figures:nope -->\n<!-- /figures -->"), root, FigureBlocks()); err == nil || !strings.Contains(err.Error(), "hedge-rate") {
		t.Errorf("unknown block: error %v", err)
	}
}
