package hedgebench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/chaos"
)

func TestMain(m *testing.M) {
	code := bpftest.CheckFDLeaks(m)
	bpftest.RemoveKedgeBinary()
	os.Exit(code)
}

func TestOptionsRejectBadParameters(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"scenario", Options{Scenario: "nope"}, "unknown scenario"},
		{"rate via Run", Options{Scenario: Rate}, "RunRate"},
		{"concurrency above n", Options{Scenario: Thesis, N: 3, Concurrency: 4}, "concurrency 4"},
		{"delay above timeout", Options{Scenario: Thesis, Delay: 2 * time.Second}, "hedge delay"},
		{"stalls overlap across replicas", Options{Scenario: Outage, Server: chaos.Config{StallPct: 60, Stall: time.Second, TTL: time.Second}}, "two replicas"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.OutDir = t.TempDir()
			err := tc.o.defaults()
			var perr *ParamError
			if tc.name != "rate via Run" && !errors.As(err, &perr) {
				t.Errorf("error %v is not a ParamError", err)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
	for _, o := range []RateOptions{
		{Levels: []int{0}},
		{Repeats: maxRounds + 1},
		{N: 10},
		{Stall: 5 * time.Millisecond},
		{Stall: 2 * time.Second},
		{N: idSpan},
		{ClientCPUs: "0", ServerCPUs: "x"},
		{ClientCPUs: "1-0", ServerCPUs: "0"},
		{ClientCPUs: "0", ServerCPUs: "4096"},
		{ClientCPUs: "0"},
	} {
		o.OutDir = t.TempDir()
		var perr *ParamError
		if err := o.defaults(); !errors.As(err, &perr) {
			t.Errorf("RateOptions %+v: error %v, want a ParamError", o, err)
		}
	}
}

func TestDefaultsPerScenario(t *testing.T) {
	th, out := Defaults(Thesis), Defaults(Outage)
	if th.N != 5000 || th.Warmup != 200 || th.Timeout != time.Second || th.Server != chaos.DefaultConfig() {
		t.Errorf("thesis defaults %+v are not Table 4.1's", th)
	}
	if out.Server.StallPct != 0 || out.Timeout >= time.Second || out.Concurrency < 2 {
		t.Errorf("outage defaults %+v: want no stalls, a short timeout and several loops", out)
	}
	// Zero fields take the scenario's defaults; set ones are kept.
	o := Options{Scenario: Outage, N: 77, OutDir: t.TempDir()}
	if err := o.defaults(); err != nil {
		t.Fatal(err)
	}
	if o.N != 77 || o.Timeout != out.Timeout || o.Concurrency != out.Concurrency {
		t.Errorf("after defaults: %+v", o)
	}
}

// series builds a bench series of ids first.. with latency f(id).
func series(first uint32, n int, f func(id uint32) (float64, bool)) bench.Series {
	s := bench.Series{Name: "t", ElapsedS: 2}
	for i := range n {
		id := first + uint32(i)
		lat, ok := f(id)
		s.IDs, s.LatenciesUS, s.OK = append(s.IDs, id), append(s.LatenciesUS, lat), append(s.OK, ok)
		if !ok {
			s.Timeouts++
		}
	}
	return s
}

func TestSummarizeRunSeparatesStalls(t *testing.T) {
	stall := 50 * time.Millisecond
	// 1000 ids: 20 stall (id % 100 < 2). Ten are rescued at 11 ms, ten answered by the
	// stalled original at 50 ms (missed); the rest answer in 100 µs, one in 900 µs.
	s := series(1000, 1000, func(id uint32) (float64, bool) {
		switch {
		case id%100 == 0:
			return 11000, true
		case id%100 == 1:
			return 50100, true
		case id == 1555:
			return 900, true
		}
		return 100, true
	})
	var run RateRun
	summarizeRun(&run, s, bench.CPUTimes{Busy: time.Second, Softirq: 250 * time.Millisecond, Wall: 2 * time.Second}, 2, stall)
	if run.Stalled != 20 || run.Rescued != 10 || run.Missed == nil || *run.Missed != 10 {
		t.Errorf("stalled %d rescued %d missed %v, want 20, 10, 10", run.Stalled, run.Rescued, run.Missed)
	}
	if run.P50US != 100 || run.MaxUS != 900 || run.RescueP50US != 11000 {
		t.Errorf("fast P50 %v max %v rescue P50 %v, want 100, 900, 11000 (stalls excluded)", run.P50US, run.MaxUS, run.RescueP50US)
	}
	if run.RPS != 500 || run.CPUBusy != 0.5 || run.CPUSoftirq != 0.125 || run.CPUPerReqUS != 1000 {
		t.Errorf("rps %v busy %v softirq %v cpu/req %v", run.RPS, run.CPUBusy, run.CPUSoftirq, run.CPUPerReqUS)
	}
	// The fast service (no stalls): every request counts for latency, none as stalled.
	var fast RateRun
	summarizeRun(&fast, s, bench.CPUTimes{}, 0, stall)
	if fast.Stalled != 0 || fast.Missed != nil || fast.MaxUS != 50100 {
		t.Errorf("fast service: stalled %d missed %v max %v", fast.Stalled, fast.Missed, fast.MaxUS)
	}
}

func TestRateLevelsPairsRounds(t *testing.T) {
	u := func(v uint64) *uint64 { return &v }
	i := func(v int) *int { return &v }
	runs := []RateRun{
		{Concurrency: 4, Round: 1, Arm: ArmUnhedged, Service: "fast", P50US: 100, P99US: 200, RPS: 1000, CPUPerReqUS: 30, ProcCPUPerReqUS: 28},
		{Concurrency: 4, Round: 1, Arm: ArmClone, Service: "fast", P50US: 103, P99US: 210, RPS: 900, CPUPerReqUS: 40, ProcCPUPerReqUS: 37, LostClones: u(0), Counters: map[string]uint64{"clones": 5}},
		{Concurrency: 4, Round: 1, Arm: ArmClone, Service: "chaos", Stalled: 5, Missed: i(1), LostClones: u(2), RPS: 800, RescueP50US: 11000, RescueMaxUS: 12000},
		{Concurrency: 4, Round: 2, Arm: ArmClone, Service: "fast", P50US: 150, P99US: 300, RPS: 950, CPUPerReqUS: 41, ProcCPUPerReqUS: 40, LostClones: u(1), Counters: map[string]uint64{"clones": 7}},
		{Concurrency: 4, Round: 2, Arm: ArmUnhedged, Service: "fast", P50US: 140, P99US: 260, RPS: 990, CPUPerReqUS: 31, ProcCPUPerReqUS: 30},
		{Concurrency: 4, Round: 2, Arm: ArmClone, Service: "chaos", Stalled: 6, Missed: i(0), LostClones: u(0), RPS: 700, RescueP50US: 10500, RescueMaxUS: 19000},
		// Round 3 has no unhedged run: its clone run counts for the medians, not the pairs.
		{Concurrency: 4, Round: 3, Arm: ArmClone, Service: "fast", P50US: 500, P99US: 900, RPS: 100},
		{Concurrency: 1, Round: 1, Arm: ArmUnhedged, Service: "fast", P50US: 1},
	}
	lv := rateLevels(runs, []int{4}, []string{ArmUnhedged, ArmClone})
	if len(lv) != 1 || len(lv[0].Arms) != 2 {
		t.Fatalf("levels %+v", lv)
	}
	un, cl := lv[0].Arms[0], lv[0].Arms[1]
	// Paired differences: rounds 1 and 2 only: (103-100, 150-140) -> median 6.5 (the mean of
	// the middle two, bench.Median).
	if cl.DeltaP50US != (Paired{Median: 6.5, Min: 3, Max: 10, N: 2}) || cl.DeltaP99US.Max != 40 {
		t.Errorf("clone deltas P50 %+v P99 %+v", cl.DeltaP50US, cl.DeltaP99US)
	}
	if r := cl.RPSRatio; r.N != 2 || r.Min != 0.9 || r.Max != 950.0/990 {
		t.Errorf("ratio %+v", r)
	}
	if cl.CPUAddedUS.Min != 10 || cl.ProcCPUAddedUS.Max != 10 || cl.ProcCPUAddedUS.Min != 9 {
		t.Errorf("CPU added %+v / %+v", cl.CPUAddedUS, cl.ProcCPUAddedUS)
	}
	// Medians over all three clone rounds (150 of 103, 150, 500).
	if cl.P50US != 150 || cl.LostClones != 1 || cl.Counters["clones"] != 12 {
		t.Errorf("clone level %+v", cl)
	}
	if un.RPSRatio.N != 0 || un.P50US != 120 || un.RPS != 995 {
		t.Errorf("unhedged level %+v: no pairs with itself", un)
	}
	cc := chaosChecks(runs, []string{ArmUnhedged, ArmClone})
	if len(cc) != 1 || cc[0].Arm != ArmClone || cc[0].Stalled != 11 || cc[0].Missed != 1 || cc[0].LostClones != 2 || cc[0].RescueMaxUS != 19000 {
		t.Errorf("chaos checks %+v", cc)
	}
	if m := median(nil); m != 0 || math.IsNaN(m) {
		t.Errorf("median of nothing = %v, want 0", m)
	}
	if got := rotate([]int{1, 2, 3}, 4); !slices.Equal(got, []int{2, 3, 1}) {
		t.Errorf("rotate by 4: %v", got)
	}
}

func TestRateReportTargets(t *testing.T) {
	r := RateResult{Arms: []string{ArmUnhedged, ArmClone}, StoredArm: "not run: test",
		Levels: []RateLevel{
			{Concurrency: 1, Arms: []ArmLevel{{Arm: ArmUnhedged}, {Arm: ArmClone, DeltaP50US: Paired{17, 15, 20, 3, 0, 0, 0}}}},
			{Concurrency: 64, Arms: []ArmLevel{{Arm: ArmUnhedged}, {Arm: ArmClone, RPSRatio: Paired{0.6, 0.55, 0.7, 3, 0, 0, 0},
				ProcCPUAddedUS: Paired{2, 1, 3, 3, 0, 0, 0}, CPUAddedUS: Paired{20, 18, 30, 3, 0, 0, 0}}}},
		}}
	var b strings.Builder
	if err := WriteRateReport(&b, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"stored path: not run: test",
		"clone path: req/s at 64 loops 0.60x (0.55x..0.70x) of unhedged (target >= 0.95x: missed, short by 0.35x)",
		"processes +2.0 (+1.0..+3.0) µs, machine +20.0 (+18.0..+30.0) µs (target <= 3 µs: met)",
		"P50 added at 1 loop(s): +17.0 (+15.0..+20.0) µs (target <= 8 µs: missed, over by 9.0 µs)",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
}

// TestOutageShort runs scenario (c) small, with real processes in a lab: the baseline
// gets nothing from the downed replica, the app hedgers hedge every request, and kedge's
// budget holds its hedges to the ratio plus the burst.
//
// The app hedgers' check asks every hedge's answer to reach its client before the client
// gives up, so the timeout is 1 s, not the benchmark's 100 ms: on a loaded machine (load
// 10: 2 of 4 runs failed) a hedge's answer took over 100 ms now and then. The runs are
// mostly timeouts (the baseline's every request, most of the 5% budget's), so they last
// requests x timeout / concurrency on any machine: 18 loops keep each near 5 s, inside
// the budget's 10 s window, which the hedge limit below assumes.
func TestOutageShort(t *testing.T) {
	bpftest.RequireRoot(t)
	o := Options{Scenario: Outage, N: 80, Warmup: 10, Concurrency: 18, Timeout: time.Second,
		Exe: bpftest.KedgeBinary(t), PyClient: "../../clients/apphedge.py", OutDir: t.TempDir()}
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bench.Series{}
	for _, s := range res.Series {
		got[s.Name] = s
		t.Logf("%s: %d timeouts, hedges %s, %d late answers (%d twice), max latency %.1f ms, %.1f s", s.Name, s.Timeouts,
			count(s.HedgesSent), s.LateDuplicates, s.Duplicates, slices.Max(s.LatenciesUS)/1e3, s.ElapsedS)
	}
	if len(got) != 5 {
		t.Fatalf("series %v, want baseline, two app hedgers, two kernel budgets", len(got))
	}
	if s := got["baseline"]; s.Timeouts != o.N {
		t.Errorf("baseline: %d timeouts of %d: the addressed replica should answer nothing", s.Timeouts, o.N)
	}
	for _, name := range []string{"app-hedged (Go)", "app-hedged (Python)"} {
		s := got[name]
		if s.Timeouts != 0 || s.HedgesSent == nil || *s.HedgesSent != o.N {
			t.Errorf("%s: %d timeouts, hedges %s: want every request hedged to the other replica and answered", name, s.Timeouts, count(s.HedgesSent))
		}
	}
	k5, k50 := got["kernel-hedged (budget 5%)"], got["kernel-hedged (budget 50%)"]
	if k5.HedgesSent == nil || k50.HedgesSent == nil {
		t.Fatal("kernel series without hedge counts")
	}
	// Tokens: burst 10 plus ratio x every request the hedger saw (warm-up included); the
	// measured share is scaled to N, so allow the burst in full.
	if limit := 10 + int(0.05*float64(o.N+o.Warmup)+0.5); *k5.HedgesSent > limit || *k5.HedgesSent == 0 {
		t.Errorf("budget 5%%: %d hedges for %d requests, want 1..%d", *k5.HedgesSent, o.N, limit)
	}
	if *k50.HedgesSent <= *k5.HedgesSent || k50.Timeouts >= k5.Timeouts {
		t.Errorf("budget 50%%: %d hedges, %d timeouts; 5%%: %d, %d: the larger budget should hedge and answer more",
			*k50.HedgesSent, k50.Timeouts, *k5.HedgesSent, k5.Timeouts)
	}
	// Nothing reaches the application twice: with the addressed replica down a request has
	// one answer at most (its hedge's), in every series. An answer after the client gave up
	// on its request (late, not twice) is the machine's timing and only logged above.
	for _, s := range res.Series {
		if s.Duplicates != 0 {
			t.Errorf("%s: %d answers to requests answered already reached the application", s.Name, s.Duplicates)
		}
	}
	for _, f := range []string{"result.json", "cdf.png", "tail.svg"} {
		if _, err := os.Stat(filepath.Join(o.OutDir, f)); err != nil {
			t.Error(err)
		}
	}
}

// count prints an optional count.
func count(p *int) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprint(*p)
}

// TestRateShort runs the rate scenario small: every arm runs at both levels in every
// round, in a balanced order, the kedge arms also run the stalling service (all its stalled
// requests accounted for) and have their programs timed, and the figures exist.
func TestRateShort(t *testing.T) {
	bpftest.RequireRoot(t)
	o := RateOptions{Levels: []int{1, 4}, N: 400, SaturationN: 400, Warmup: 20, Repeats: 2, Stall: 40 * time.Millisecond,
		Delay: 5 * time.Millisecond, ProgRuns: 450, Exe: bpftest.KedgeBinary(t), OutDir: t.TempDir()}
	res, err := RunRate(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	arms, err := selectArms(DefaultArms)
	if err != nil {
		t.Fatal(err)
	}
	kedgeArms := len(arms) - 2 // unhedged and control run no hedger
	if want := o.Repeats * (len(arms)*len(o.Levels) + kedgeArms); len(res.Runs) != want || len(res.Levels) != 2 {
		t.Fatalf("%d runs, %d levels: want %d runs (each arm at each level, plus the stalling service per kedge arm, per round)", len(res.Runs), len(res.Levels), want)
	}
	first := map[int]string{}
	for _, r := range res.Runs {
		if r.Order == 0 {
			first[r.Round] = r.Arm
		}
		if r.Requests != o.N || r.RPS <= 0 || r.P50US <= 0 || r.CPUPerReqUS < 0 || r.ProcCPUUS["client"] <= 0 {
			t.Errorf("run %+v: missing figures", r)
		}
		kedge := r.Arm != ArmUnhedged && r.Arm != ArmControl
		if kedge != (r.Counters != nil) || kedge != (r.LostClones != nil) {
			t.Errorf("run %+v: hedger counters must be there exactly when kedge is", r)
		}
		if kedge && r.Counters["requests"] < uint64(o.N) {
			t.Errorf("run %+v: the hedger saw %d requests, the client sent %d", r, r.Counters["requests"], o.N+o.Warmup)
		}
		if r.Service == "chaos" {
			// 2% of the ids stall; the ids are the client's, so stalls exist in every run.
			if r.Stalled == 0 || r.Missed == nil || r.Rescued+*r.Missed != r.Stalled {
				t.Errorf("chaos run %+v: stalled requests unaccounted", r)
			}
			if r.Rescued == 0 {
				t.Errorf("chaos run %+v: no stalled request rescued", r)
			}
		}
	}
	if first[1] == first[2] {
		t.Errorf("rounds 1 and 2 both start with %s: the order does not rotate", first[1])
	}
	for _, l := range res.Levels {
		for _, a := range l.Arms[1:] {
			if a.RPSRatio.N != o.Repeats || a.DeltaP50US.N != o.Repeats {
				t.Errorf("level %d arm %s: %d pairs, want one per round", l.Concurrency, a.Arm, a.RPSRatio.N)
			}
		}
	}
	if len(res.Prog) != kedgeArms || len(res.Chaos) != kedgeArms {
		t.Errorf("%d program timings, %d chaos checks: want one per kedge arm", len(res.Prog), len(res.Chaos))
	}
	for _, p := range res.Prog {
		if p.SplitNS <= 0 || p.RespNS <= 0 || p.Counters["requests"] != uint64(o.ProgRuns) || p.Counters["responses"] != uint64(o.ProgRuns) {
			t.Errorf("program timing %+v", p)
		}
		if p.Arm == ArmClone && p.Counters["clones"] != uint64(o.ProgRuns) {
			t.Errorf("clone arm's test runs made %d clones of %d requests", p.Counters["clones"], o.ProgRuns)
		}
		if p.Arm == ArmStored && (p.Counters["stored"] != uint64(o.ProgRuns) || p.Counters["clones"] != 0) {
			t.Errorf("stored arm's test runs stored %d and cloned %d of %d requests", p.Counters["stored"], p.Counters["clones"], o.ProgRuns)
		}
	}
	for _, f := range []string{"result.json", "latency.png", "throughput.svg", "cpu.png"} {
		if _, err := os.Stat(filepath.Join(o.OutDir, f)); err != nil {
			t.Error(err)
		}
	}
	var b strings.Builder
	if err := WriteRateReport(&b, res); err != nil || !strings.Contains(b.String(), "| 4 | clone |") {
		t.Errorf("report %v:\n%s", err, b.String())
	}
}
