package hedgebench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/kedge-dev/kedge/internal/bench"
)

// A table scenario run several times (--repeat): per method the range of its tail figures
// over the runs, and whether the kernel hedger's tail was below every user-space hedger's
// in each run. One run's MAX is one request: only a verdict that holds in every run says
// "reliably".

// RepeatSchema versions RepeatSummary.
const RepeatSchema = "kedge.bench.repeat/v1"

// Range is a figure's minimum and maximum over the runs (ms).
type Range struct {
	Min float64 `json:"min"`
	Max float64 `json:"max"`
}

// MethodRun is one method's tail in one run (ms).
type MethodRun struct {
	P99  float64 `json:"p99_ms"`
	P999 float64 `json:"p99_9_ms"`
	Max  float64 `json:"max_ms"`
}

// MethodRanges is one method over the runs.
type MethodRanges struct {
	Name string      `json:"name"`
	Runs []MethodRun `json:"runs"`
	P99  Range       `json:"p99_ms"`
	P999 Range       `json:"p99_9_ms"`
	Max  Range       `json:"max_ms"`
}

// RepeatSummary is summary.json of a repeated table scenario.
type RepeatSummary struct {
	bench.Envelope
	Runs    int            `json:"runs"`
	Methods []MethodRanges `json:"methods"`
	// KernelBelow counts the runs in which the kernel-hedged series' figure was strictly
	// below that of every user-space (app-hedged) series; absent without both kinds.
	KernelBelow *struct {
		P999 int `json:"p99_9"`
		Max  int `json:"max"`
	} `json:"kernel_below_user_space,omitempty"`
	// KernelPath is the path the kernel hedger's requests took in each run, from its
	// counters: "stored" (every request stored), "clone" (none), or "mixed".
	KernelPath []string `json:"kernel_path,omitempty"`
}

// kernelSeries is the name of the (one) kernel-hedged series of the table scenarios.
const kernelSeries = "kernel-hedged"

// SummarizeRepeats builds the summary of runs of one scenario (every run with the same series).
func SummarizeRepeats(ctx context.Context, scenario string, runs []bench.Result) (RepeatSummary, error) {
	sum := RepeatSummary{Runs: len(runs)}
	if len(runs) == 0 {
		return sum, fmt.Errorf("summarize repeats: no runs")
	}
	sum.Envelope = bench.NewEnvelope(ctx, RepeatSchema, scenario, runs[0].Parameters)
	// The busiest start of any run.
	for _, r := range runs {
		if len(r.LoadAvg) == 3 && (len(sum.LoadAvg) != 3 || r.LoadAvg[0] > sum.LoadAvg[0]) {
			sum.LoadAvg = r.LoadAvg
		}
	}
	for i, s := range runs[0].Series {
		m := MethodRanges{Name: s.Name}
		for k, r := range runs {
			if len(r.Series) != len(runs[0].Series) || r.Series[i].Name != s.Name {
				return sum, fmt.Errorf("summarize repeats: run %d does not have series %q at position %d", k+1, s.Name, i)
			}
			x := bench.Summarize(r.Series[i])
			m.Runs = append(m.Runs, MethodRun{P99: x.P99, P999: x.P999, Max: x.Max})
		}
		m.P99 = rangeOf(m.Runs, func(r MethodRun) float64 { return r.P99 })
		m.P999 = rangeOf(m.Runs, func(r MethodRun) float64 { return r.P999 })
		m.Max = rangeOf(m.Runs, func(r MethodRun) float64 { return r.Max })
		sum.Methods = append(sum.Methods, m)
	}
	ki := slices.IndexFunc(sum.Methods, func(m MethodRanges) bool { return m.Name == kernelSeries })
	var users []MethodRanges
	for _, m := range sum.Methods {
		if strings.HasPrefix(m.Name, "app-hedged") {
			users = append(users, m)
		}
	}
	if ki >= 0 && len(users) > 0 {
		sum.KernelBelow = &struct {
			P999 int `json:"p99_9"`
			Max  int `json:"max"`
		}{}
		k := sum.Methods[ki]
		for r := range runs {
			below999, belowMax := true, true
			for _, u := range users {
				below999 = below999 && k.Runs[r].P999 < u.Runs[r].P999
				belowMax = belowMax && k.Runs[r].Max < u.Runs[r].Max
			}
			if below999 {
				sum.KernelBelow.P999++
			}
			if belowMax {
				sum.KernelBelow.Max++
			}
		}
	}
	for _, r := range runs {
		if p := kernelPath(r); p != "" {
			sum.KernelPath = append(sum.KernelPath, p)
		}
	}
	return sum, nil
}

func rangeOf(runs []MethodRun, f func(MethodRun) float64) Range {
	rg := Range{Min: f(runs[0]), Max: f(runs[0])}
	for _, r := range runs[1:] {
		rg.Min, rg.Max = min(rg.Min, f(r)), max(rg.Max, f(r))
	}
	return rg
}

// kernelPath reads the kernel-hedged series' counters from a run's parameters: stored
// when the hedger stored every request it saw, clone when it stored none.
func kernelPath(r bench.Result) string {
	c, ok := r.Parameters[kernelSeries+".kernel.counters"].(map[string]uint64)
	if !ok {
		return ""
	}
	switch stored := c["stored"]; {
	case stored == 0:
		return "clone"
	case stored >= c["requests"]:
		return "stored"
	default:
		return fmt.Sprintf("mixed (%d of %d stored)", stored, c["requests"])
	}
}

// WriteRepeatReport prints the ranges and the verdict.
func WriteRepeatReport(w io.Writer, s RepeatSummary) error {
	var b strings.Builder
	fmt.Fprintf(&b, "\n%s over %d runs: range (min..max) per method, ms\n", s.Scenario, s.Runs)
	fmt.Fprintf(&b, "| Method | P99 | P99.9 | MAX |\n|---|---:|---:|---:|\n")
	for _, m := range s.Methods {
		fmt.Fprintf(&b, "| %s | %.2f..%.2f | %.2f..%.2f | %.2f..%.2f |\n", m.Name,
			m.P99.Min, m.P99.Max, m.P999.Min, m.P999.Max, m.Max.Min, m.Max.Max)
	}
	if k := s.KernelBelow; k != nil {
		verdict := func(n int) string {
			if n == s.Runs {
				return "in every run"
			}
			return fmt.Sprintf("in %d of %d runs: not reliably", n, s.Runs)
		}
		fmt.Fprintf(&b, "kernel-hedged below every user-space hedger: P99.9 %s; MAX %s\n", verdict(k.P999), verdict(k.Max))
	}
	if len(s.KernelPath) > 0 {
		fmt.Fprintf(&b, "kernel hedger's path per run: %s\n", strings.Join(s.KernelPath, ", "))
	}
	_, err := io.WriteString(w, b.String())
	return err
}
