package hedgebench

import (
	"fmt"
	"image/color"
	"io"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/kedge-dev/kedge/internal/bench"
)

// WriteRateReport prints the per-level table of r, the targets beside the paired
// figures, the stalling service's check and the programs' run time.
func WriteRateReport(w io.Writer, r RateResult) error {
	var b strings.Builder
	fmt.Fprintf(&b, "| Loops | Arm | req/s | req/s ratio | P50 (µs) | ΔP50 | P99 (µs) | ΔP99 | CPU/req machine (µs) | ΔCPU machine | CPU/req processes (µs) | ΔCPU processes | timeouts | lost clones |\n")
	fmt.Fprintf(&b, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, l := range r.Levels {
		for _, a := range l.Arms {
			fmt.Fprintf(&b, "| %d | %s | %.0f | %s | %.1f | %s | %.1f | %s | %.1f | %s | %.1f | %s | %d | %d |\n",
				l.Concurrency, a.Arm, a.RPS, pairedStr(a.RPSRatio, "%.2fx"), a.P50US, pairedStr(a.DeltaP50US, "%+.1f"),
				a.P99US, pairedStr(a.DeltaP99US, "%+.1f"), a.CPUPerReqUS, pairedStr(a.CPUAddedUS, "%+.1f"),
				a.ProcCPUPerReqUS, pairedStr(a.ProcCPUAddedUS, "%+.1f"), a.Timeouts, a.LostClones)
		}
	}
	fmt.Fprintf(&b, "\nrate, %v requests per run, %v rounds (arms in a balanced order per round), backend %s, %s\n",
		r.Parameters["n"], r.Parameters["rounds"], r.Backend, r.Describe())
	if h := holdsNote(r); h != "" {
		b.WriteString(h + "\n")
	}
	b.WriteString("ratio and Δ: this arm against the unhedged run of the same round, median (min..max) over the rounds.\n" +
		"CPU/req machine: busy time of all CPUs (/proc/stat, other work on the machine included) per request sent;\n" +
		"CPU/req processes: user+system time of the client (rusage), both chaos servers, the ksoftirqd threads and the\n" +
		"driver with kedge's control plane (/proc/<pid>/stat), per request sent; softirq work is in the time of the task\n" +
		"it interrupted or of ksoftirqd (tick accounting, no IRQ time accounting on this kernel).\n")

	if len(r.Levels) > 0 {
		low, sat := r.Levels[0], r.Levels[len(r.Levels)-1]
		b.WriteString(positionNote(r))
		fmt.Fprintf(&b, "\nTargets (docs/hedging.md), paired per round:\n")
		if c, ok := armAt(sat, ArmControl); ok {
			lo, _ := armAt(low, ArmControl)
			fmt.Fprintf(&b, "  control (the unhedged path again, the bench's own spread): req/s at %d loops %s%s, CPU added %s µs (processes), P50 added at %d loop(s) %s µs\n",
				sat.Concurrency, pairedStr(c.RPSRatio, "%.2fx"), ciStr(c.RPSRatio, "%.2fx"), pairedStr(c.ProcCPUAddedUS, "%+.1f"), low.Concurrency, pairedStr(lo.DeltaP50US, "%+.1f"))
		}
		for _, arm := range []string{ArmStored, ArmClone} {
			s, ok := armAt(sat, arm)
			lo, _ := armAt(low, arm)
			if !ok {
				fmt.Fprintf(&b, "  %s path: %s\n", arm, r.StoredArm)
				continue
			}
			fmt.Fprintf(&b, "  %s path: req/s at %d loops %s of unhedged%s (target >= %gx: %s)\n", arm, sat.Concurrency,
				pairedStr(s.RPSRatio, "%.2fx"), ciStr(s.RPSRatio, "%.2fx"), Targets.RPSRatio, verdict(s.RPSRatio.Median >= Targets.RPSRatio, s.RPSRatio.N,
					fmt.Sprintf("short by %.2fx", Targets.RPSRatio-s.RPSRatio.Median)))
			if s.RPSRatioBoth.N > 0 {
				fmt.Fprintf(&b, "    against both unhedged runs of the round (unhedged and control): %s%s\n", pairedStr(s.RPSRatioBoth, "%.2fx"), ciStr(s.RPSRatioBoth, "%.2fx"))
			}
			fmt.Fprintf(&b, "    CPU per request added at %d loops: processes %s µs, machine %s µs (target <= %.0f µs: %s)\n", sat.Concurrency,
				pairedStr(s.ProcCPUAddedUS, "%+.1f"), pairedStr(s.CPUAddedUS, "%+.1f"), Targets.CPUAddedUS,
				verdict(s.ProcCPUAddedUS.Median <= Targets.CPUAddedUS, s.ProcCPUAddedUS.N,
					fmt.Sprintf("over by %.1f µs (processes)", s.ProcCPUAddedUS.Median-Targets.CPUAddedUS)))
			fmt.Fprintf(&b, "    P50 added at %d loop(s): %s µs (target <= %.0f µs: %s)\n", low.Concurrency,
				pairedStr(lo.DeltaP50US, "%+.1f"), Targets.P50AddedUS, verdict(lo.DeltaP50US.Median <= Targets.P50AddedUS, lo.DeltaP50US.N,
					fmt.Sprintf("over by %.1f µs", lo.DeltaP50US.Median-Targets.P50AddedUS)))
		}
	}
	for _, p := range r.Prog {
		fmt.Fprintf(&b, "BPF run time per request, %s path (BPF_PROG_TEST_RUN, %d requests, one run each): hedge_split %.0f ns, hedge_resp %.0f ns (counters: %s)\n",
			p.Arm, p.Requests, p.SplitNS, p.RespNS, counterStr(p.Counters, "requests", "responses", "clones", "stored", "store_too_large", "store_full"))
	}
	for _, c := range r.Chaos {
		fmt.Fprintf(&b, "%v%% stalls at %d loops, %s path: %.0f req/s, %d stalled, %d missed hedges, %d budget refusals, %d lost clones, %d timeouts, rescued in P50 %.1f ms, max %.1f ms\n",
			r.Parameters["stall_pct"], c.Concurrency, c.Arm, c.RPS, c.Stalled, c.Missed, c.BudgetExhausted, c.LostClones, c.Timeouts,
			c.RescueP50US/1000, c.RescueMaxUS/1000)
		if cs := counterStr(c.Counters, storeCounters...); cs != "" {
			fmt.Fprintf(&b, "  %s path's counters there: %s\n", c.Arm, cs)
		}
	}
	writeAttribution(&b, r)
	var idle []string
	for _, arm := range r.Arms {
		idle = append(idle, fmt.Sprintf("%s %.3f", arm, r.IdleCPU[arm]))
	}
	fmt.Fprintf(&b, "idle (nothing sent), busy CPUs: %s\n", strings.Join(idle, ", "))
	_, err := io.WriteString(w, b.String())
	return err
}

// positionNote says, per level, whether the order of the arms in a round moves a run's
// figures (RateLevel.ByPosition) and each arm's ratio to unhedged when it ran before and
// after it.
func positionNote(r RateResult) string {
	var b strings.Builder
	for _, l := range r.Levels {
		if len(l.ByPosition) == 0 {
			continue
		}
		var pos, ba []string
		for i, p := range l.ByPosition {
			s := fmt.Sprintf("%d: req/s %s", i+1, pairedStr(p, "%.2fx"))
			if i < len(l.ByPositionP50) {
				s += fmt.Sprintf(", P50 %.2fx", l.ByPositionP50[i].Median)
			}
			pos = append(pos, s)
		}
		for _, a := range l.Arms {
			if a.RPSRatioBefore.N+a.RPSRatioAfter.N > 0 {
				ba = append(ba, fmt.Sprintf("%s %s before, %s after (%d/%d rounds)", a.Arm, pairedStr(a.RPSRatioBefore, "%.2fx"),
					pairedStr(a.RPSRatioAfter, "%.2fx"), a.RPSRatioBefore.N, a.RPSRatioAfter.N))
			}
		}
		fmt.Fprintf(&b, "Position in the round at %d loop(s), a run over its arm's median (1.00x: no effect): %s\n", l.Concurrency, strings.Join(pos, "; "))
		var st []string
		for _, a := range l.Arms {
			if a.Steal.N > 0 && a.Steal.Max > 0 {
				st = append(st, fmt.Sprintf("%s %s", a.Arm, pairedStr(a.Steal, "%.3f")))
			}
		}
		if len(st) > 0 {
			fmt.Fprintf(&b, "  CPUs the hypervisor took during the runs (steal): %s\n", strings.Join(st, "; "))
		}
		if len(ba) > 0 {
			fmt.Fprintf(&b, "  ratio to unhedged by whether the arm ran before or after it: %s\n", strings.Join(ba, "; "))
		}
	}
	return b.String()
}

// storeCounters are the stored path's counters (issue 14), shown where the hedger has them.
var storeCounters = []string{"hedges_sent", "stored", "store_too_large", "store_full", "overdue_dropped", "pacer_ticks", "tick_hedges"}

func armAt(l RateLevel, arm string) (ArmLevel, bool) {
	i := slices.IndexFunc(l.Arms, func(a ArmLevel) bool { return a.Arm == arm })
	if i < 0 {
		return ArmLevel{}, false
	}
	return l.Arms[i], true
}

func pairedStr(p Paired, f string) string {
	if p.N == 0 {
		return "-"
	}
	if p.N == 1 {
		return fmt.Sprintf(f, p.Median)
	}
	return fmt.Sprintf(f+" ("+f+".."+f+")", p.Median, p.Min, p.Max)
}

// ciStr is the median's sign-test interval of p (Paired.CILo), "" when it has none.
func ciStr(p Paired, f string) string {
	if p.CILevel == 0 {
		return ""
	}
	return fmt.Sprintf(", median within "+f+".."+f+" (%.0f%%)", p.CILo, p.CIHi, 100*p.CILevel)
}

func verdict(met bool, n int, missed string) string {
	switch {
	case n == 0:
		return "not measured"
	case met:
		return "met"
	}
	return "missed, " + missed
}

func counterStr(c map[string]uint64, names ...string) string {
	var parts []string
	for _, n := range names {
		if v, ok := c[n]; ok {
			parts = append(parts, fmt.Sprintf("%s %d", n, v))
		}
	}
	return strings.Join(parts, ", ")
}

// writeRateCharts draws requests/s, P50 and CPU per request against concurrency, one
// line per arm.
func writeRateCharts(dir string, r RateResult) error {
	pick := func(arm string, f func(ArmLevel) float64) plotter.XYs {
		var xy plotter.XYs
		for _, l := range r.Levels {
			if a, ok := armAt(l, arm); ok {
				xy = append(xy, plotter.XY{X: float64(l.Concurrency), Y: f(a)})
			}
		}
		return xy
	}
	charts := []struct {
		file, title, ylabel string
		f                   func(ArmLevel) float64
	}{
		{"throughput", "Requests per second (median over the rounds)", "requests/s", func(a ArmLevel) float64 { return a.RPS }},
		{"latency", "P50 latency (median over the rounds)", "P50 (µs)", func(a ArmLevel) float64 { return a.P50US }},
		{"cpu", "CPU per request: client, servers, ksoftirqd, kedge", "CPU time per request (µs)", func(a ArmLevel) float64 { return a.ProcCPUPerReqUS }},
	}
	colors := map[string]color.Color{ArmUnhedged: color.Black, ArmControl: color.Gray{Y: 140}, ArmClone: color.RGBA{R: 214, G: 39, B: 40, A: 255},
		ArmStored: color.RGBA{R: 31, G: 119, B: 180, A: 255}}
	for _, c := range charts {
		p := plot.New()
		p.Title.Text = c.title
		p.X.Label.Text = "concurrent client loops (log scale)"
		p.Y.Label.Text = c.ylabel
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Y.Min = 0
		p.Add(plotter.NewGrid())
		p.Legend.Top, p.Legend.Left = true, true
		for i, arm := range r.Arms {
			xy := pick(arm, c.f)
			if len(xy) == 0 {
				continue
			}
			ln, pts, err := plotter.NewLinePoints(xy)
			if err != nil {
				return fmt.Errorf("rate chart %s: %w", c.file, err)
			}
			col := colors[arm]
			ln.Color, pts.Color = col, col
			if i%2 == 1 {
				ln.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
			}
			p.Add(ln, pts)
			p.Legend.Add(arm, ln, pts)
		}
		if err := bench.SavePlot(p, 8*vg.Inch, 5*vg.Inch, filepath.Join(dir, c.file)); err != nil {
			return err
		}
	}
	return nil
}

// attributionPacer are the pacer counters the attribution table shows, per request.
var attributionPacer = []string{"ticks_armed", "ticks_delivered", "ticks_piggybacked", "tick_passes", "filler_passes", "carried_in"}

// writeAttribution prints, per level and arm, the softirqs raised and the pacer's work per
// request (medians over the rounds): where the CPU a kedge arm adds goes outside its
// programs.
func writeAttribution(b *strings.Builder, r RateResult) {
	fmt.Fprintf(b, "\nPer request sent (median over the rounds): softirqs raised (/proc/softirqs) and the pacer's work\n")
	fmt.Fprintf(b, "| Loops | Arm | softirq CPUs | NET_RX | NET_TX | TIMER | HRTIMER | SCHED | %s |\n", strings.Join(attributionPacer, " | "))
	fmt.Fprintf(b, "|---:|---|---:|---:|---:|---:|---:|---:|%s\n", strings.Repeat("---:|", len(attributionPacer)))
	for _, l := range r.Levels {
		for _, a := range l.Arms {
			fmt.Fprintf(b, "| %d | %s | %.3f |", l.Concurrency, a.Arm, a.CPUSoftirq)
			for _, k := range []string{"NET_RX", "NET_TX", "TIMER", "HRTIMER", "SCHED"} {
				fmt.Fprintf(b, " %.3f |", a.SoftirqsPerReq[k])
			}
			for _, k := range attributionPacer {
				if v, ok := a.PacerPerReq[k]; ok {
					fmt.Fprintf(b, " %.3f |", v)
				} else {
					b.WriteString(" - |")
				}
			}
			b.WriteString("\n")
		}
	}
}
