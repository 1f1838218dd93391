package hedgebench

import (
	"math"
	"slices"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/chaos"
)

// The rate result's figures: each run summarized, the medians per level and arm, the ratios
// paired by round, the chaos service's check.

// summarizeRun fills run's latency, CPU and stall figures from series s. The CPU per
// request divides by run.Sent (warm-up included: the CPU was read around the whole run),
// or by the measured requests when Sent is not set.
func summarizeRun(run *RateRun, s bench.Series, cpu bench.CPUTimes, stallPct int, stall time.Duration) {
	run.Requests, run.ElapsedS = s.Requests(), s.ElapsedS
	if run.Sent == 0 {
		run.Sent = run.Requests
	}
	if s.ElapsedS > 0 {
		run.RPS = float64(s.Requests()) / s.ElapsedS
	}
	run.Timeouts, run.LateDuplicates = s.Timeouts, s.LateDuplicates
	var fastLat, rescue []float64
	for i, id := range s.IDs {
		if stallPct > 0 && chaos.Stalls(0, id, stallPct) {
			run.Stalled++
			// Answered before the stall ended: a hedge did it (the original is held for
			// the whole stall).
			if s.OK[i] && s.LatenciesUS[i] < float64(stall.Microseconds()) {
				run.Rescued++
				rescue = append(rescue, s.LatenciesUS[i])
			}
			continue
		}
		fastLat = append(fastLat, s.LatenciesUS[i])
	}
	slices.Sort(fastLat)
	run.P50US, run.P99US = pct(fastLat, 50), pct(fastLat, 99)
	run.P999US, run.MaxUS = pct(fastLat, 99.9), pct(fastLat, 100)
	if stallPct > 0 {
		missed := run.Stalled - run.Rescued
		run.Missed = &missed
		slices.Sort(rescue)
		run.RescueP50US, run.RescueMaxUS = pct(rescue, 50), pct(rescue, 100)
	}
	if secs := cpu.Wall.Seconds(); secs > 0 {
		run.CPUBusy, run.CPUSoftirq = cpu.BusyCPUs(), cpu.Softirq.Seconds()/secs
	}
	if run.Sent > 0 {
		run.CPUPerReqUS = float64(cpu.Busy.Microseconds()) / float64(run.Sent)
	}
}

// rateLevels summarises the fast-service runs per level and arm: medians over the rounds,
// and per kedge arm the medians of its comparisons with the unhedged run of its round.
func rateLevels(runs []RateRun, levels []int, arms []string) []RateLevel {
	out := make([]RateLevel, 0, len(levels))
	for _, c := range levels {
		lv := RateLevel{Concurrency: c}
		byRound := map[string]map[int]*RateRun{}
		for i := range runs {
			r := &runs[i]
			if r.Concurrency != c || r.Service != "fast" {
				continue
			}
			if byRound[r.Arm] == nil {
				byRound[r.Arm] = map[int]*RateRun{}
			}
			byRound[r.Arm][r.Round] = r
		}
		for _, arm := range arms {
			al := ArmLevel{Arm: arm}
			var rps, p50, p99, cpu, pcpu, ratio, both, before, after, dp50, dp99, dcpu, dpcpu, sirq, steal []float64
			sirqs, pacer := map[string][]float64{}, map[string][]float64{}
			for round, r := range byRound[arm] {
				rps, p50, p99 = append(rps, r.RPS), append(p50, r.P50US), append(p99, r.P99US)
				sirq, steal = append(sirq, r.CPUSoftirq), append(steal, r.StealCPUs)
				perReq(sirqs, r.Softirqs, r.Sent)
				perReq(pacer, r.Pacer, r.Sent)
				cpu, pcpu = append(cpu, r.CPUPerReqUS), append(pcpu, r.ProcCPUPerReqUS)
				al.Timeouts += r.Timeouts
				if r.LostClones != nil {
					al.LostClones += *r.LostClones
				}
				for k, v := range r.Counters {
					if al.Counters == nil {
						al.Counters = map[string]uint64{}
					}
					al.Counters[k] += v
				}
				u := byRound[ArmUnhedged][round]
				if arm == ArmUnhedged || u == nil {
					continue
				}
				if c := byRound[ArmControl][round]; arm != ArmControl && c != nil && u.RPS > 0 && c.RPS > 0 {
					both = append(both, r.RPS/math.Sqrt(u.RPS*c.RPS))
				}
				if u.RPS > 0 {
					ratio = append(ratio, r.RPS/u.RPS)
					if r.Order < u.Order {
						before = append(before, r.RPS/u.RPS)
					} else {
						after = append(after, r.RPS/u.RPS)
					}
				}
				dp50, dp99 = append(dp50, r.P50US-u.P50US), append(dp99, r.P99US-u.P99US)
				dcpu, dpcpu = append(dcpu, r.CPUPerReqUS-u.CPUPerReqUS), append(dpcpu, r.ProcCPUPerReqUS-u.ProcCPUPerReqUS)
			}
			al.RPS, al.P50US, al.P99US, al.CPUPerReqUS, al.ProcCPUPerReqUS = median(rps), median(p50), median(p99), median(cpu), median(pcpu)
			al.RPSRatio, al.DeltaP50US, al.DeltaP99US = paired(ratio), paired(dp50), paired(dp99)
			al.RPSRatioBefore, al.RPSRatioAfter, al.Steal = paired(before), paired(after), paired(steal)
			al.RPSRatioBoth = paired(both)
			al.CPUAddedUS, al.ProcCPUAddedUS = paired(dcpu), paired(dpcpu)
			al.SoftirqsPerReq, al.PacerPerReq, al.CPUSoftirq = medians(sirqs), medians(pacer), median(sirq)
			lv.Arms = append(lv.Arms, al)
		}
		lv.ByPosition = byPosition(byRound, lv.Arms, func(r *RateRun) float64 { return r.RPS }, func(a ArmLevel) float64 { return a.RPS })
		lv.ByPositionP50 = byPosition(byRound, lv.Arms, func(r *RateRun) float64 { return r.P50US }, func(a ArmLevel) float64 { return a.P50US })
		out = append(out, lv)
	}
	return out
}

// byPosition is, per position in the round, each run's figure (of) over its arm's median
// (med), median and range over the runs that ran in that position.
func byPosition(byRound map[string]map[int]*RateRun, arms []ArmLevel, of func(*RateRun) float64, med func(ArmLevel) float64) []Paired {
	var at [][]float64
	for _, a := range arms {
		m := med(a)
		if m <= 0 {
			continue
		}
		for _, r := range byRound[a.Arm] {
			for len(at) <= r.Order {
				at = append(at, nil)
			}
			at[r.Order] = append(at[r.Order], of(r)/m)
		}
	}
	out := make([]Paired, len(at))
	for i, v := range at {
		out[i] = paired(v)
	}
	return out
}

func paired(v []float64) Paired {
	if len(v) == 0 {
		return Paired{}
	}
	p := Paired{Median: median(v), Min: slices.Min(v), Max: slices.Max(v), N: len(v)}
	if k, level := signInterval(len(v)); k > 0 {
		s := slices.Sorted(slices.Values(v))
		p.CILo, p.CIHi, p.CILevel = s[k-1], s[len(s)-k], level
	}
	return p
}

// signInterval is the sign test's confidence interval for a median of n values: the k-th
// smallest and the k-th largest, k the largest for which the interval's level, 1 - 2 P(X < k)
// with X ~ Binomial(n, 1/2), is at least 0.95; k 0 when no k reaches it (n < 6).
func signInterval(n int) (k int, level float64) {
	tail, c := 0.0, 1.0 // P(X <= i), C(n, i)
	half := math.Pow(0.5, float64(n))
	for i := 0; i < n/2; i++ {
		tail += c * half
		if 1-2*tail < 0.95 {
			break
		}
		k, level = i+1, 1-2*tail
		c = c * float64(n-i) / float64(i+1)
	}
	return k, level
}

// chaosChecks sums the stalling service's runs per kedge arm.
func chaosChecks(runs []RateRun, arms []string) []ChaosCheck {
	var out []ChaosCheck
	for _, arm := range arms {
		cc := ChaosCheck{Arm: arm}
		var rps, resc []float64
		for _, r := range runs {
			if r.Arm != arm || r.Service != "chaos" {
				continue
			}
			cc.Concurrency = r.Concurrency
			rps, resc = append(rps, r.RPS), append(resc, r.RescueP50US)
			cc.Stalled += r.Stalled
			cc.Timeouts += r.Timeouts
			cc.BudgetExhausted += r.Counters["budget_exhausted"]
			cc.RescueMaxUS = max(cc.RescueMaxUS, r.RescueMaxUS)
			for k, v := range r.Counters {
				if cc.Counters == nil {
					cc.Counters = map[string]uint64{}
				}
				cc.Counters[k] += v
			}
			if r.Missed != nil {
				cc.Missed += *r.Missed
			}
			if r.LostClones != nil {
				cc.LostClones += *r.LostClones
			}
		}
		if len(rps) == 0 {
			continue
		}
		cc.RPS, cc.RescueP50US = median(rps), median(resc)
		out = append(out, cc)
	}
	return out
}

// perReq appends each counter of c divided by n to acc.
func perReq(acc map[string][]float64, c map[string]uint64, n int) {
	for k, v := range c {
		acc[k] = append(acc[k], float64(v)/float64(max(n, 1)))
	}
}

// medians is the median of each list (nil for none).
func medians(acc map[string][]float64) map[string]float64 {
	if len(acc) == 0 {
		return nil
	}
	out := make(map[string]float64, len(acc))
	for k, v := range acc {
		out[k] = median(v)
	}
	return out
}

// median is bench.Median, 0 for no values (JSON has no NaN).
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	return bench.Median(v)
}

// pct is bench.Percentile with 0 for no values (JSON has no NaN).
func pct(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return bench.Percentile(sorted, p)
}
