package hedgebench

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/chaos"
	"github.com/kedge-dev/kedge/internal/docfigures"
)

// FigureBlocks are the hedging figure blocks of the documents (docs/benchmarks.md,
// docs/hedging.md), rendered from docs/results/hedge; tools/docfigures rewrites them.
func FigureBlocks() map[string]docfigures.Block {
	const out = "--out docs/results/hedge"
	rate := "kedge bench hedge --scenario rate " + out
	table := func(scenario string) docfigures.Block {
		return docfigures.Block{Results: "hedge", Command: "kedge bench hedge --scenario " + scenario + " " + out,
			Render: func(dir string) (string, error) { return tableFigures(dir, scenario) }}
	}
	return map[string]docfigures.Block{
		"hedge-rate":            {Results: "hedge", Command: rate, Render: rateFigures},
		"hedge-targets":         {Results: "hedge", Command: rate, Render: targetFigures},
		"hedge-gc":              table(GC),
		"hedge-pressure":        {Results: "hedge", Command: "kedge bench hedge --scenario pressure --repeat 5 -n 2000 --warmup 100 " + out, Render: pressureFigures},
		"hedge-thesis":          table(Thesis),
		"hedge-adaptive":        table(Adaptive),
		"hedge-outage":          table(Outage),
		"hedge-memcached":       {Results: "hedge", Command: "kedge bench hedge --scenario memcached " + out, Render: memcachedFigures},
		"hedge-memcached-brief": {Results: "hedge", Command: "kedge bench hedge --scenario memcached " + out, Render: memcachedBrief},
	}
}

func readMemcached(dir string) (MemcachedResult, error) {
	var r MemcachedResult
	err := docfigures.ReadResult(filepath.Join(dir, Memcached, "result.json"), MemcachedSchema, &r)
	return r, err
}

// memcachedBrief renders dir/memcached/result.json in a few lines: throughput and the get
// tail of both arms, and the sets on srv2.
func memcachedBrief(dir string) (string, error) {
	r, err := readMemcached(dir)
	if err != nil || len(r.Arms) != 2 {
		return "", errors.Join(err, errors.New("memcached result: want two arms"))
	}
	u, k := r.Arms[0], r.Arms[1]
	return fmt.Sprintf("From [results/hedge/memcached](results/hedge/memcached) (%s, commit %.12s, load average %v at start): "+
		"%.2fx the unhedged operations per second (median of %d paired rounds); gets P99 %.2f -> %.2f ms, "+
		"P99.9 %.2f -> %.2f ms, MAX %.2f -> %.2f ms, %d hedges for %d gets; "+
		"sets counted by srv2's memcached: %d and %d of %d and %d sent.\n",
		r.Timestamp.Format(time.DateOnly), r.Commit, r.LoadAvg, k.RatioToUnhedged, k.Runs,
		u.P99US/1e3, k.P99US/1e3, u.P999US/1e3, k.P999US/1e3, u.MaxUS/1e3, k.MaxUS/1e3, k.HedgesSent, k.Gets,
		u.Srv2Sets, k.Srv2Sets, u.SetsSent, k.SetsSent), nil
}

// memcachedFigures renders dir/memcached/result.json: the report's table and what the
// replicas counted.
func memcachedFigures(dir string) (string, error) {
	r, err := readMemcached(dir)
	if err != nil {
		return "", err
	}
	p := r.Parameters
	var b strings.Builder
	ratio, _ := p["budget_ratio"].(float64)
	clients, _ := p["clients_used"].([]any)
	fmt.Fprintf(&b, "%s, %s; %v client processes x %v operations (%v%% sets) per run, %v rounds, hedge delay %v ms, budget %g%% + burst %v; clients: %s.\n\n",
		r.Timestamp.Format(time.DateOnly), r.Describe(), p["clients"], p["ops_per_client"], p["set_pct"], p["rounds"],
		p["hedge_delay_ms"], ratio*100, p["budget_burst"], joinAny(clients, "; "))
	fmt.Fprintf(&b, "| Arm | ops/s (median) | ratio to unhedged | get P50 (ms) | P95 | P99 | P99.9 | MAX | gets without value | sets sent | srv1 cmd_set | srv2 cmd_set | srv2 cmd_get | hedges sent |\n")
	fmt.Fprintf(&b, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, a := range r.Arms {
		fmt.Fprintf(&b, "| %s | %.0f | %.2fx | %.3f | %.3f | %.3f | %.3f | %.3f | %d | %d | %d | %d | %d | %d |\n",
			a.Arm, a.OpsPerSec, a.RatioToUnhedged, a.P50US/1e3, a.P95US/1e3, a.P99US/1e3, a.P999US/1e3, a.MaxUS/1e3,
			a.GetMisses, a.SetsSent, a.Srv1Sets, a.Srv2Sets, a.Srv2Gets, a.HedgesSent)
	}
	var stops, runs int
	var stopped float64
	for _, run := range r.Runs {
		runs++
		stops += run.Pauses.Pauses
		stopped += run.Pauses.Coverage
	}
	if runs > 0 {
		fmt.Fprintf(&b, "\nsrv1 stopped %d times over %d runs (%.1f%% of the time on average). Get MAX per round (ms):", stops, runs, stopped/float64(runs)*100)
		for _, a := range r.Arms {
			var maxes []string
			for _, run := range r.Runs {
				if run.Arm == a.Arm {
					maxes = append(maxes, fmt.Sprintf("%.1f", run.MaxUS/1e3))
				}
			}
			fmt.Fprintf(&b, " %s %s;", a.Arm, strings.Join(maxes, ", "))
		}
		b.WriteString("\n")
	}
	return b.String(), nil
}

// readRate reads dir/rate/result.json.
func readRate(dir string) (RateResult, error) {
	var r RateResult
	err := docfigures.ReadResult(filepath.Join(dir, Rate, "result.json"), RateSchema, &r)
	return r, err
}

func rateFigures(dir string) (string, error) {
	r, err := readRate(dir)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	sat := ""
	if n, ok := r.Parameters["n_saturation"]; ok && len(r.Levels) > 0 {
		sat = fmt.Sprintf(" (%v at %d loops)", n, r.Levels[len(r.Levels)-1].Concurrency)
	}
	fmt.Fprintf(&b, "%s, %s; %v requests per run%s, %v rounds, backend %s.\n\n", r.Timestamp.Format(time.DateOnly), r.Describe(),
		r.Parameters["n"], sat, r.Parameters["rounds"], r.Backend)
	if h := holdsNote(r); h != "" {
		b.WriteString(h + ".\n\n")
	}
	fmt.Fprintf(&b, "| Loops | Arm | req/s | ratio to unhedged | P50 (µs) | ΔP50 (µs) | P99 (µs) | CPU/req processes (µs) | ΔCPU processes | CPU/req machine (µs) | ΔCPU machine |\n")
	fmt.Fprintf(&b, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, l := range r.Levels {
		for _, a := range l.Arms {
			fmt.Fprintf(&b, "| %d | %s | %.0f | %s | %.1f | %s | %.1f | %.1f | %s | %.1f | %s |\n", l.Concurrency, a.Arm, a.RPS,
				pairedStr(a.RPSRatio, "%.2fx"), a.P50US, pairedStr(a.DeltaP50US, "%+.1f"), a.P99US,
				a.ProcCPUPerReqUS, pairedStr(a.ProcCPUAddedUS, "%+.1f"), a.CPUPerReqUS, pairedStr(a.CPUAddedUS, "%+.1f"))
		}
	}
	b.WriteString("\n(ratio and Δ: against the unhedged run of the same round, median (min..max) over the rounds.)\n\n")
	if p := positionNote(r); p != "" {
		for _, line := range strings.Split(strings.TrimSpace(p), "\n") {
			fmt.Fprintf(&b, "- %s.\n", strings.TrimSpace(line))
		}
	}
	for _, p := range r.Prog {
		fmt.Fprintf(&b, "- BPF run time per request, %s path (BPF_PROG_TEST_RUN, %d requests): hedge_split %.0f ns, hedge_resp %.0f ns (%s).\n",
			p.Arm, p.Requests, p.SplitNS, p.RespNS, counterStr(p.Counters, "clones", "stored", "store_too_large", "store_full"))
	}
	for _, c := range r.Chaos {
		fmt.Fprintf(&b, "- %v%% of ids stalled %v ms at %d loops, %s path: %.0f req/s, %d stalled, %d missed hedges, %d budget refusals, %d lost clones, %d timeouts.\n",
			r.Parameters["stall_pct"], r.Parameters["stall_ms"], c.Concurrency, c.Arm, c.RPS, c.Stalled, c.Missed, c.BudgetExhausted, c.LostClones, c.Timeouts)
		if cs := counterStr(c.Counters, storeCounters...); cs != "" {
			fmt.Fprintf(&b, "  Counters: %s.\n", cs)
		}
	}
	for _, l := range r.Levels {
		var parts []string
		for _, a := range l.Arms {
			if a.SoftirqsPerReq == nil {
				continue
			}
			part := fmt.Sprintf("%s NET_RX %.2f, NET_TX %.2f", a.Arm, a.SoftirqsPerReq["NET_RX"], a.SoftirqsPerReq["NET_TX"])
			if a.PacerPerReq != nil {
				part += fmt.Sprintf(" (pacer: ticks %.3f, tick passes %.3f, filler passes %.3f)",
					a.PacerPerReq["ticks_delivered"], a.PacerPerReq["tick_passes"], a.PacerPerReq["filler_passes"])
			}
			parts = append(parts, part)
		}
		if len(parts) > 0 {
			fmt.Fprintf(&b, "- Softirqs raised per request at %d loop(s) (/proc/softirqs; the pacer's own work per request): %s.\n", l.Concurrency, strings.Join(parts, "; "))
		}
	}
	var idle []string
	for _, arm := range r.Arms {
		idle = append(idle, fmt.Sprintf("%s %.3f", arm, r.IdleCPU[arm]))
	}
	fmt.Fprintf(&b, "- Idle (nothing sent), busy CPUs: %s.\n", strings.Join(idle, ", "))
	if r.StoredArm != "" {
		fmt.Fprintf(&b, "- Stored arm: %s.\n", r.StoredArm)
	}
	return b.String(), nil
}

// targetFigures is the targets of the hedging data path (Targets) beside the rate
// scenario's paired figures.
func targetFigures(dir string) (string, error) {
	r, err := readRate(dir)
	if err != nil {
		return "", err
	}
	if len(r.Levels) == 0 {
		return "", errors.New("rate result without levels")
	}
	low, sat := r.Levels[0], r.Levels[len(r.Levels)-1]
	var b strings.Builder
	fmt.Fprintf(&b, "From [results/hedge/rate](results/hedge/rate) (%s, commit %.12s, load average %v at start):\n\n", r.Timestamp.Format(time.DateOnly), r.Commit, r.LoadAvg)
	if h := holdsNote(r); h != "" {
		b.WriteString(h + ".\n\n")
	}
	fmt.Fprintf(&b, "| Path | req/s at %d loops / unhedged (>= %gx) | CPU/req added, processes (<= %.0f µs) | CPU/req added, machine | P50 added at %d loop(s) (<= %.0f µs) |\n",
		sat.Concurrency, Targets.RPSRatio, Targets.CPUAddedUS, low.Concurrency, Targets.P50AddedUS)
	b.WriteString("|---|---:|---:|---:|---:|\n")
	if c, ok := armAt(sat, ArmControl); ok {
		lo, _ := armAt(low, ArmControl)
		fmt.Fprintf(&b, "| control (unhedged again: the bench's spread) | %s%s | %s | %s | %s |\n", pairedStr(c.RPSRatio, "%.2fx"), ciStr(c.RPSRatio, "%.2fx"),
			pairedStr(c.ProcCPUAddedUS, "%+.1f"), pairedStr(c.CPUAddedUS, "%+.1f"), pairedStr(lo.DeltaP50US, "%+.1f"))
	}
	for _, arm := range []string{ArmStored, ArmClone} {
		s, ok := armAt(sat, arm)
		lo, _ := armAt(low, arm)
		if !ok {
			fmt.Fprintf(&b, "| %s | - | - | - | - |\n", arm)
			continue
		}
		mark := func(met bool, n int, by string) string {
			switch {
			case n == 0:
				return ""
			case met:
				return " (met)"
			}
			return " (missed by " + by + ")"
		}
		fmt.Fprintf(&b, "| %s | %s%s%s | %s%s | %s | %s%s |\n", arm,
			pairedStr(s.RPSRatio, "%.2fx"), ciStr(s.RPSRatio, "%.2fx"), mark(s.RPSRatio.Median >= Targets.RPSRatio, s.RPSRatio.N, fmt.Sprintf("%.2fx", Targets.RPSRatio-s.RPSRatio.Median)),
			pairedStr(s.ProcCPUAddedUS, "%+.1f"), mark(s.ProcCPUAddedUS.Median <= Targets.CPUAddedUS, s.ProcCPUAddedUS.N, fmt.Sprintf("%.1f µs", s.ProcCPUAddedUS.Median-Targets.CPUAddedUS)),
			pairedStr(s.CPUAddedUS, "%+.1f"),
			pairedStr(lo.DeltaP50US, "%+.1f"), mark(lo.DeltaP50US.Median <= Targets.P50AddedUS, lo.DeltaP50US.N, fmt.Sprintf("%.1f µs", lo.DeltaP50US.Median-Targets.P50AddedUS)))
	}
	if s, ok := armAt(sat, ArmStored); ok && s.RPSRatioBoth.N > 0 {
		fmt.Fprintf(&b, "\nThe stored path's req/s at %d loops against both unhedged runs of each round (unhedged and control, their geometric mean): %s%s.\n",
			sat.Concurrency, pairedStr(s.RPSRatioBoth, "%.2fx"), ciStr(s.RPSRatioBoth, "%.2fx"))
	}
	if r.StoredArm != "" {
		fmt.Fprintf(&b, "\nStored arm: %s.\n", r.StoredArm)
	}
	return b.String(), nil
}

// tableFigures renders a Table 4.2 scenario's result: the table, hedge excess per method
// and, for gc, the pauses each client met.
func tableFigures(dir, scenario string) (string, error) {
	p := filepath.Join(dir, scenario, "result.json")
	if _, err := os.Stat(p); err != nil {
		return "", err
	}
	r, err := bench.ReadFile(p)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s, %s.\n\n", r.Timestamp.Format(time.DateOnly), r.Describe())
	sums := make([]bench.Summary, len(r.Series))
	for i, s := range r.Series {
		sums[i] = bench.Summarize(s)
	}
	if err := bench.WriteTable(&b, sums, "baseline"); err != nil {
		return "", err
	}
	b.WriteString("\n")
	stallPct, _ := r.Parameters["stall_pct"].(float64)
	delayMS, _ := r.Parameters["hedge_delay_ms"].(float64)
	isStall := func(id uint32) bool { return chaos.Stalls(0, id, int(stallPct)) }
	for _, s := range r.Series {
		if s.Name == "baseline" {
			continue
		}
		ex := bench.HedgeExcess(s, isStall, time.Duration(delayMS*float64(time.Millisecond)))
		if len(ex) == 0 {
			continue
		}
		slices.Sort(ex)
		fmt.Fprintf(&b, "- %s: hedge excess on %d stalled requests P50 %.2f ms, P99 %.2f ms, MAX %.2f ms; %d late duplicates at the application.\n",
			s.Name, len(ex), bench.Percentile(ex, 50), bench.Percentile(ex, 99), ex[len(ex)-1], s.LateDuplicates)
	}
	if scenario == GC {
		var sched PauseSchedule
		var runs map[string]PauseRun
		if err := reparse(r.Parameters["pause_schedule"], &sched); err != nil {
			return "", err
		}
		if err := reparse(r.Parameters["pause_runs"], &runs); err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "- Client pauses: seed %d, %g-%g ms, %.1f%% of the time planned (SIGSTOP/SIGCONT from the harness, %d pauses in the schedule up to the longest run's end):",
			sched.Seed, sched.MinMS, sched.MaxMS, sched.Coverage*100, len(sched.Pauses))
		for _, s := range r.Series {
			if pr, ok := runs[s.Name]; ok {
				fmt.Fprintf(&b, " %s %d pauses, %.1f%% of its %.1f s;", s.Name, pr.Pauses, pr.Coverage*100, pr.ElapsedMS/1000)
			}
		}
		b.WriteString("\n")
	}
	return b.String(), nil
}

// reparse decodes a value read as generic JSON into a typed one.
func reparse(v any, into any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, into)
}

// pressureFigures renders pressure/summary.json (a --repeat run).
func pressureFigures(dir string) (string, error) {
	var s RepeatSummary
	if err := docfigures.ReadResult(filepath.Join(dir, Pressure, "summary.json"), RepeatSchema, &s); err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s, %s.\n", s.Timestamp.Format(time.DateOnly), s.Describe())
	if err := WriteRepeatReport(&b, s); err != nil {
		return "", err
	}
	return b.String(), nil
}

// joinAny joins the values of a JSON array with sep.
func joinAny(v []any, sep string) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprint(x)
	}
	return strings.Join(parts, sep)
}
