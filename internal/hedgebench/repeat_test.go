package hedgebench

import (
	"context"
	"strings"
	"testing"

	"github.com/kedge-dev/kedge/internal/bench"
)

// run builds a result whose series have one request each (latency in ms = P99.9 = MAX).
func repeatRun(lat map[string]float64, counters map[string]uint64) bench.Result {
	var r bench.Result
	for _, name := range []string{"baseline", "app-hedged (Python)", "app-hedged (Go)", "kernel-hedged"} {
		r.Series = append(r.Series, bench.Series{Name: name, IDs: []uint32{1}, LatenciesUS: []float64{lat[name] * 1000}, OK: []bool{true}})
	}
	if counters != nil {
		r.Parameters = map[string]any{"kernel-hedged.kernel.counters": counters}
	}
	return r
}

func TestSummarizeRepeatsRangesAndVerdict(t *testing.T) {
	runs := []bench.Result{
		repeatRun(map[string]float64{"baseline": 400, "app-hedged (Python)": 13, "app-hedged (Go)": 15, "kernel-hedged": 12}, map[string]uint64{"requests": 100, "stored": 100}),
		// The kernel ties Go: not below.
		repeatRun(map[string]float64{"baseline": 401, "app-hedged (Python)": 14, "app-hedged (Go)": 12.5, "kernel-hedged": 12.5}, map[string]uint64{"requests": 100, "stored": 0}),
		repeatRun(map[string]float64{"baseline": 402, "app-hedged (Python)": 18, "app-hedged (Go)": 16, "kernel-hedged": 12.2}, map[string]uint64{"requests": 100, "stored": 40}),
	}
	s, err := SummarizeRepeats(context.Background(), Pressure, runs)
	if err != nil {
		t.Fatal(err)
	}
	if s.Runs != 3 || len(s.Methods) != 4 || s.Schema != RepeatSchema {
		t.Fatalf("summary %+v", s)
	}
	if k := s.Methods[3]; k.Max != (Range{12, 12.5}) || k.P999 != (Range{12, 12.5}) {
		t.Errorf("kernel ranges %+v", k)
	}
	if g := s.Methods[2]; g.Max != (Range{12.5, 16}) {
		t.Errorf("Go ranges %+v", g)
	}
	if s.KernelBelow == nil || s.KernelBelow.Max != 2 || s.KernelBelow.P999 != 2 {
		t.Errorf("kernel below in %+v runs, want 2 and 2", s.KernelBelow)
	}
	if want := []string{"stored", "clone", "mixed (40 of 100 stored)"}; strings.Join(s.KernelPath, "|") != strings.Join(want, "|") {
		t.Errorf("paths %v, want %v", s.KernelPath, want)
	}
	var b strings.Builder
	if err := WriteRepeatReport(&b, s); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| kernel-hedged | 12.00..12.50 | 12.00..12.50 | 12.00..12.50 |", "P99.9 in 2 of 3 runs: not reliably", "MAX in 2 of 3 runs"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	// Every run better: "in every run".
	s2, err := SummarizeRepeats(context.Background(), Pressure, runs[:1])
	if err != nil {
		t.Fatal(err)
	}
	b.Reset()
	_ = WriteRepeatReport(&b, s2)
	if !strings.Contains(b.String(), "P99.9 in every run; MAX in every run") {
		t.Errorf("report:\n%s", b.String())
	}
	// Runs of different scenarios do not mix.
	bad := repeatRun(map[string]float64{}, nil)
	bad.Series = bad.Series[1:]
	if _, err := SummarizeRepeats(context.Background(), Pressure, []bench.Result{runs[0], bad}); err == nil {
		t.Error("runs with different series summarized")
	}
	if _, err := SummarizeRepeats(context.Background(), Pressure, nil); err == nil {
		t.Error("no runs summarized")
	}
}
