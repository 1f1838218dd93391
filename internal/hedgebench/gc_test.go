package hedgebench

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/bpftest"
	"github.com/kedge-dev/kedge/internal/lab"
)

func TestPauseScheduleSeededBoundedCovering(t *testing.T) {
	spec := DefaultPauses()
	const horizon = 2000 * time.Second
	a, b := spec.Schedule(horizon), spec.Schedule(horizon)
	if !slices.Equal(a, b) {
		t.Fatal("the same seed gave two schedules")
	}
	other := spec
	other.Seed++
	if slices.Equal(a[:10], other.Schedule(horizon)[:10]) {
		t.Error("seeds 1 and 2 gave the same first pauses")
	}
	// A shorter horizon is a prefix of a longer one: every client sees the same pauses,
	// however long it runs.
	short := spec.Schedule(60 * time.Second)
	if len(short) == 0 || !slices.Equal(short, a[:len(short)]) {
		t.Errorf("the 60 s schedule (%d pauses) is not a prefix of the %v one", len(short), horizon)
	}
	var prevEnd time.Duration
	for i, p := range a {
		if p.Len < spec.Min || p.Len > spec.Max {
			t.Fatalf("pause %d: %v outside %v..%v", i, p.Len, spec.Min, spec.Max)
		}
		if p.At <= prevEnd {
			t.Fatalf("pause %d at %v starts before the previous one ended (%v)", i, p.At, prevEnd)
		}
		prevEnd = p.At + p.Len
	}
	if prevEnd > horizon {
		t.Errorf("last pause ends at %v, after the horizon %v", prevEnd, horizon)
	}
	// ~70,000 pauses: the share of stopped time is within 3% (relative) of the spec's.
	for _, cov := range []float64{0.01, 0.03, 0.2} {
		s := spec
		s.Coverage = cov
		got := Coverage(s.Schedule(horizon), horizon)
		if math.Abs(got-cov)/cov > 0.03 {
			t.Errorf("coverage %.4f over %v, want %.2f", got, horizon, cov)
		}
	}
	// Both bounds are reached (uniform lengths) and a fixed length works.
	lens := make([]time.Duration, len(a))
	for i, p := range a {
		lens[i] = p.Len
	}
	if lo, hi := slices.Min(lens), slices.Max(lens); lo > spec.Min+time.Millisecond || hi < spec.Max-time.Millisecond {
		t.Errorf("lengths %v..%v do not span %v..%v", lo, hi, spec.Min, spec.Max)
	}
	fixed := PauseSpec{Seed: 3, Coverage: 0.1, Min: 20 * time.Millisecond, Max: 20 * time.Millisecond}
	for _, p := range fixed.Schedule(10 * time.Second) {
		if p.Len != 20*time.Millisecond {
			t.Fatalf("fixed 20ms spec gave a pause of %v", p.Len)
		}
	}
}

func TestPauseSpecRejectsBadRanges(t *testing.T) {
	for _, s := range []PauseSpec{
		{Coverage: 0, Min: time.Millisecond, Max: time.Millisecond},
		{Coverage: 0.6, Min: time.Millisecond, Max: time.Millisecond},
		{Coverage: math.NaN(), Min: time.Millisecond, Max: time.Millisecond},
		{Coverage: 0.03, Min: 0, Max: time.Millisecond},
		{Coverage: 0.03, Min: 2 * time.Millisecond, Max: time.Millisecond},
		{Coverage: 0.03, Min: time.Millisecond, Max: 2 * time.Second},
	} {
		var perr *ParamError
		if err := s.Validate(); !errors.As(err, &perr) {
			t.Errorf("%+v: error %v, want a ParamError", s, err)
		}
	}
	if err := DefaultPauses().Validate(); err != nil {
		t.Error(err)
	}
	o := Options{Scenario: GC, OutDir: t.TempDir(), Pauses: PauseSpec{Coverage: 0.9, Min: 1, Max: 1}}
	if err := o.defaults(); err == nil {
		t.Error("gc options with coverage 0.9 accepted")
	}
}

func TestCoverageClipsAtHorizon(t *testing.T) {
	ps := []Pause{{At: 0, Len: 10}, {At: 50, Len: 10}, {At: 95, Len: 10}}
	if got := Coverage(ps, 100); got != 0.25 {
		t.Errorf("coverage %v, want 0.25 (10 + 10 + 5 of 100)", got)
	}
	if Coverage(ps, 0) != 0 {
		t.Error("coverage of an empty horizon")
	}
}

// TestGCShort runs the gc scenario small with real processes: every method runs, each
// client is stopped by the schedule, and the schedule and what each run saw are in
// result.json. It asserts structure, not timing.
func TestGCShort(t *testing.T) {
	bpftest.RequireRoot(t)
	// Short pauses, often: a run of a second or two meets several.
	o := Options{Scenario: GC, N: 300, Warmup: 20, Exe: bpftest.KedgeBinary(t),
		PyClient: "../../clients/apphedge.py", OutDir: t.TempDir(),
		Pauses: PauseSpec{Seed: 7, Coverage: 0.1, Min: 5 * time.Millisecond, Max: 20 * time.Millisecond}}
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, len(res.Series))
	for i, s := range res.Series {
		names[i] = s.Name
		if s.Requests() != o.N {
			t.Errorf("%s: %d requests, want %d", s.Name, s.Requests(), o.N)
		}
	}
	want := []string{"baseline", "app-hedged (Python)", "app-hedged (Go)", "kernel-hedged"}
	if !slices.Equal(names, want) {
		t.Fatalf("series %v, want %v", names, want)
	}
	// Read back what was written: the schedule and one record per method.
	var back struct {
		bench.Envelope
		Series []bench.Series `json:"series"`
	}
	if err := bench.ReadJSON(filepath.Join(o.OutDir, "result.json"), &back); err != nil {
		t.Fatal(err)
	}
	sched, ok := back.Parameters["pause_schedule"].(map[string]any)
	if !ok || sched["seed"] != float64(7) || sched["coverage"] != 0.1 {
		t.Fatalf("pause_schedule %v", back.Parameters["pause_schedule"])
	}
	if ps, _ := sched["pauses"].([]any); len(ps) == 0 {
		t.Error("no pauses recorded in the schedule")
	}
	runs, _ := back.Parameters["pause_runs"].(map[string]any)
	planned := o.Pauses.Schedule(scheduleHorizon)
	for _, name := range want {
		r, ok := runs[name].(map[string]any)
		if !ok {
			t.Errorf("no pause record for %s", name)
			continue
		}
		n := int(r["pauses"].(float64))
		applied, _ := r["applied"].([]any)
		if n != len(applied) || r["elapsed_ms"].(float64) <= 0 {
			t.Errorf("%s: record %v", name, r)
		}
		// The same schedule for everyone: run k's i-th pause is the schedule's i-th.
		for i, a := range applied {
			p := a.(map[string]any)["planned"].(map[string]any)
			if time.Duration(p["at_ns"].(float64)) != planned[i].At || time.Duration(p["len_ns"].(float64)) != planned[i].Len {
				t.Errorf("%s: pause %d is %v, the schedule's is %+v", name, i, p, planned[i])
				break
			}
		}
	}
	for _, f := range []string{"cdf.png", "tail.svg"} {
		if _, err := os.Stat(filepath.Join(o.OutDir, f)); err != nil {
			t.Error(err)
		}
	}
}

// TestRunPausedStopsTheProcess: a process stopped for 400 ms cannot exit before it is
// continued (its own 100 ms sleep ends while it is stopped), and a run cancelled while its
// process is stopped kills it rather than leaving it stopped.
func TestRunPausedStopsTheProcess(t *testing.T) {
	bpftest.RequireRoot(t)
	l, err := lab.Up(lab.Spec{Name: "gcpause", Fabric: lab.Bridge, Hosts: []string{"h"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	h := l.Host("h")
	sched := []Pause{{At: 20 * time.Millisecond, Len: 400 * time.Millisecond}, {At: time.Hour, Len: time.Millisecond}}
	rec, err := runPaused(context.Background(), h, sched, "/bin/sleep", "0.1")
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Applied) != 1 {
		t.Fatalf("applied %+v, want the first pause only", rec.Applied)
	}
	a := rec.Applied[0]
	if a.Resumed-a.Stopped < 400*time.Millisecond || rec.Elapsed < a.Resumed {
		t.Errorf("stopped %v..%v, exited at %v: the process ran on while stopped", a.Stopped, a.Resumed, rec.Elapsed)
	}
	// A failing process's error carries its stderr.
	if _, err := runPaused(context.Background(), h, nil, "/bin/sh", "-c", "echo boom >&2; exit 3"); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("failing process: error %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = runPaused(ctx, h, []Pause{{At: 10 * time.Millisecond, Len: time.Hour}}, "/bin/sleep", "30")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("cancelled run: error %v, want the context's", err)
	}
}
