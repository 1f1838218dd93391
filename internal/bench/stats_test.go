package bench

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPercentileNearestRank(t *testing.T) {
	ten := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	fiveK := make([]float64, 5000)
	for i := range fiveK {
		fiveK[i] = float64(i + 1)
	}
	tests := []struct {
		name   string
		sorted []float64
		p      float64
		want   float64
	}{
		{"single value", []float64{42}, 50, 42},
		{"p0 is min", ten, 0, 1},
		{"p10 of 10", ten, 10, 1},
		{"p11 of 10 rounds rank up", ten, 11, 2},
		{"median of 10 is the 5th", ten, 50, 5},
		{"p95 of 10", ten, 95, 10},
		{"p100 is max", ten, 100, 10},
		{"p above 100 is max", ten, 150, 10},
		{"p99 of 5000 is the 4950th", fiveK, 99, 4950},
		{"p99.9 of 5000 is the 4995th", fiveK, 99.9, 4995},
		{"p95 of 5000 is the 4750th", fiveK, 95, 4750},
		{"p50 of 5000 is the 2500th", fiveK, 50, 2500},
		{"two values median is the lower", []float64{1, 3}, 50, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Percentile(tt.sorted, tt.p); got != tt.want {
				t.Errorf("Percentile(p=%v) = %v, want %v", tt.p, got, tt.want)
			}
		})
	}
	if got := Percentile(nil, 50); !math.IsNaN(got) {
		t.Errorf("Percentile(empty) = %v, want NaN", got)
	}
}

// thesisLike builds a series of n requests from id 200: ids with id%100 < 2 take stallMS,
// the others normalMS; hedged series answer stalled ids at hedgedMS instead.
func thesisLike(name string, n int, normalMS, stallMS float64, hedges *int) Series {
	s := Series{Name: name, HedgesSent: hedges}
	for i := range n {
		id := uint32(200 + i)
		lat := normalMS
		if id%100 < 2 {
			lat = stallMS
		}
		s.IDs = append(s.IDs, id)
		s.LatenciesUS = append(s.LatenciesUS, lat*1000)
		s.OK = append(s.OK, true)
	}
	return s
}

func TestSummarizeAndReduction(t *testing.T) {
	h := 100
	base := Summarize(thesisLike("baseline", 5000, 2.5, 401, nil))
	app := Summarize(thesisLike("app", 5000, 2.5, 12.5, &h))
	if base.P50 != 2.5 || base.P95 != 2.5 || base.P99 != 401 || base.Max != 401 {
		t.Errorf("baseline summary %+v", base)
	}
	if !math.IsNaN(base.ExtraLoad) {
		t.Errorf("baseline extra load %v, want unknown (NaN)", base.ExtraLoad)
	}
	if app.P99 != 12.5 || app.ExtraLoad != 0.02 {
		t.Errorf("app summary %+v, want P99 12.5 and extra load 0.02", app)
	}
	if r := Reduction(base.P99, app.P99); math.Abs(r-96.88) > 0.01 {
		t.Errorf("reduction %v, want ~96.88", r)
	}
	if r := Reduction(0, 1); !math.IsNaN(r) {
		t.Errorf("reduction against 0 = %v, want NaN", r)
	}
}

func TestHedgeExcess(t *testing.T) {
	isStall := func(id uint32) bool { return id%100 < 2 }
	s := thesisLike("app", 1000, 2, 12.75, nil)
	// One stalled request timed out: it must not count.
	for i, id := range s.IDs {
		if id == 300 {
			s.OK[i], s.Timeouts, s.LatenciesUS[i] = false, 1, 1e6
		}
	}
	ex := HedgeExcess(s, isStall, 10*time.Millisecond)
	if len(ex) != 19 {
		t.Fatalf("%d excess values, want 19 (20 stalled ids, one timed out)", len(ex))
	}
	for _, v := range ex {
		if math.Abs(v-0.75) > 1e-9 {
			t.Fatalf("excess %v, want 0.75 (12.75 - 10 - median 2)", v)
		}
	}
	if ex := HedgeExcess(Series{}, isStall, time.Millisecond); ex != nil {
		t.Errorf("excess of empty series = %v, want nil", ex)
	}
}

func TestWriteTable(t *testing.T) {
	h := 102
	sums := []Summary{
		Summarize(thesisLike("Baseline", 5000, 2.64, 401.14, nil)),
		Summarize(thesisLike("App-Hedged", 5000, 2.65, 13.08, &h)),
		{Name: "Kernel-Hedged", P50: 2.66, P95: 3.04, P99: 12.83, P999: 13.1, Max: 13.35, ExtraLoad: math.NaN(), Backend: "same"},
	}
	sums[1].Backend = "alt replica"
	var b strings.Builder
	if err := WriteTable(&b, sums, "Baseline"); err != nil {
		t.Fatal(err)
	}
	want := `| Method        | P50 (ms) | P95 (ms) | P99 (ms) | P99.9 (ms) | MAX (ms) | P99 reduction | Extra load | Backend     |
| ------------- | -------: | -------: | -------: | ---------: | -------: | ------------: | ---------: | ----------- |
| Baseline      |     2.64 |     2.64 |   401.14 |     401.14 |   401.14 |             - |          - | -           |
| App-Hedged    |     2.65 |     2.65 |    13.08 |      13.08 |    13.08 |         96.7% |       2.0% | alt replica |
| Kernel-Hedged |     2.66 |     3.04 |    12.83 |      13.10 |    13.35 |         96.8% |          - | same        |
`
	if got := b.String(); got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
}

func TestTableRowsWithoutBaseline(t *testing.T) {
	rows := TableRows([]Summary{{Name: "only", P99: 5, ExtraLoad: math.NaN()}}, "missing")
	if got := rows[0][6]; got != "-" {
		t.Errorf("reduction without a baseline = %q, want -", got)
	}
}

func TestNice125AndTicks(t *testing.T) {
	tests := []struct {
		x        float64
		up, want float64
	}{
		{2.3, 0, 2}, {2.3, 1, 5}, {401, 1, 500}, {401, 0, 200}, {12.5, 1, 20}, {1, 1, 1}, {1, 0, 1},
		{0.9, 0, 0.5}, {5, 1, 5}, {700, 1, 1000},
	}
	for _, tt := range tests {
		if got := nice125(tt.x, tt.up == 1); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("nice125(%v, up=%v) = %v, want %v", tt.x, tt.up == 1, got, tt.want)
		}
	}
	var labels []string
	for _, tk := range (logTicks125{}).Ticks(2, 500) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	if want := []string{"2", "5", "10", "20", "50", "100", "200", "500"}; !slices.Equal(labels, want) {
		t.Errorf("log tick labels %v, want %v", labels, want)
	}
	labels = nil
	for _, tk := range (fractionTicks{}).Ticks(0.95, 1) {
		labels = append(labels, tk.Label)
	}
	if want := []string{"0.95", "0.96", "0.97", "0.98", "0.99", "1.00"}; !slices.Equal(labels, want) {
		t.Errorf("fraction tick labels %v, want %v", labels, want)
	}
}

func TestMedianSummaries(t *testing.T) {
	run := func(p999, mx float64) []Summary {
		return []Summary{{Name: "baseline", P50: 2, P999: 400, Max: 401, ExtraLoad: math.NaN()},
			{Name: "kernel", P50: 2.1, P99: 12, P999: p999, Max: mx, ExtraLoad: 0.02}}
	}
	med, spread, err := MedianSummaries([][]Summary{run(12.3, 13), run(12.9, 20), run(12.5, 12.4)})
	if err != nil {
		t.Fatal(err)
	}
	if med[1].P999 != 12.5 || med[1].Max != 13 || med[1].P99 != 12 || med[1].ExtraLoad != 0.02 {
		t.Errorf("kernel medians %+v", med[1])
	}
	if !math.IsNaN(med[0].ExtraLoad) {
		t.Errorf("unknown extra load became %v", med[0].ExtraLoad)
	}
	if sp := spread["kernel"]; sp[0] != (Spread{12.5, 12.3, 12.9}) || sp[1] != (Spread{13, 12.4, 20}) {
		t.Errorf("spread %+v", sp)
	}
	if _, _, err := MedianSummaries([][]Summary{run(1, 1), run(1, 1)[:1]}); err == nil {
		t.Error("runs with different series: no error")
	}
	if _, _, err := MedianSummaries(nil); err == nil {
		t.Error("no runs: no error")
	}
}

func TestMedianDuration(t *testing.T) {
	for _, tc := range []struct {
		d    []time.Duration
		want time.Duration
	}{
		{nil, 0},
		{[]time.Duration{3 * time.Millisecond}, 3 * time.Millisecond},
		{[]time.Duration{5, 1, 3}, 3},
		{[]time.Duration{4, 1, 2, 3}, 2}, // mean of the middle two, truncated to the ns
		{[]time.Duration{10 * time.Millisecond, 12 * time.Millisecond}, 11 * time.Millisecond},
	} {
		if got := MedianDuration(tc.d); got != tc.want {
			t.Errorf("MedianDuration(%v) = %v, want %v", tc.d, got, tc.want)
		}
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		v    []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{3, 1, 2}, 2},
		{[]float64{0.9, 1.1, 0.8, 1.0}, 0.95}, // mean of the middle two
		{[]float64{1, 1, 1, 5, 5, 5}, 3},
	} {
		if got := Median(tc.v); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("Median(%v) = %v, want %v", tc.v, got, tc.want)
		}
	}
	if !math.IsNaN(Median(nil)) || !math.IsNaN(Median([]float64{1, math.NaN()})) {
		t.Error("median of nothing, or of a NaN, is not NaN")
	}
	v := []float64{3, 1, 2}
	if Median(v); v[0] != 3 {
		t.Errorf("Median sorted its argument: %v", v)
	}
}
