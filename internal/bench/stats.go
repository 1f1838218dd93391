package bench

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// Percentile returns the p-th percentile (0 < p <= 100) of sorted (ascending) by the
// nearest-rank method: the smallest value such that at least p% of the values are <= it,
// i.e. sorted[ceil(p/100*N)-1]. It never interpolates, so every reported percentile is a
// latency some request actually had. p <= 0 gives the minimum; an empty slice gives NaN.
//
// With N = 5000 (the thesis setting) P99 is the 4950th value and P99.9 the 4995th; so when
// 2% of the requests stall, P99 lands inside the stalled ones.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return math.NaN()
	}
	if p <= 0 {
		return sorted[0]
	}
	// Subtract a little before ceil so that p/100*N landing on an integer is not pushed up
	// by floating-point error (99.9/100*5000 is 4994.999999999999 or 4995.000000000001).
	rank := int(math.Ceil(p/100*float64(n) - 1e-9))
	rank = max(1, min(rank, n))
	return sorted[rank-1]
}

// Summary is the row of Table 4.2 for one series, latencies in milliseconds.
type Summary struct {
	Name     string
	N        int
	Timeouts int
	P50      float64
	P95      float64
	P99      float64
	P999     float64
	Max      float64
	// ExtraLoad is hedges sent per measured request (0.02 = 2%), NaN when unknown.
	ExtraLoad float64
	Backend   string
}

// Summarize computes the percentiles of s (timeouts included at their waited time).
func Summarize(s Series) Summary {
	ms := make([]float64, len(s.LatenciesUS))
	for i, us := range s.LatenciesUS {
		ms[i] = us / 1000
	}
	slices.Sort(ms)
	sum := Summary{
		Name:      s.Name,
		N:         len(ms),
		Timeouts:  s.Timeouts,
		P50:       Percentile(ms, 50),
		P95:       Percentile(ms, 95),
		P99:       Percentile(ms, 99),
		P999:      Percentile(ms, 99.9),
		Max:       Percentile(ms, 100),
		ExtraLoad: math.NaN(),
		Backend:   s.Backend,
	}
	if s.HedgesSent != nil && len(ms) > 0 {
		sum.ExtraLoad = float64(*s.HedgesSent) / float64(len(ms))
	}
	return sum
}

// Reduction is the relative reduction of v against base, in percent ((base-v)/base*100);
// NaN when base is not positive.
func Reduction(base, v float64) float64 {
	if !(base > 0) {
		return math.NaN()
	}
	return (base - v) / base * 100
}

// HedgeExcess measures how late hedging rescues the requests it should rescue: for every
// measured request whose id stalls (per isStall) and that was answered, the latency minus
// the hedge threshold minus the median latency of the requests that do not stall. An ideal
// hedger that fires exactly at the threshold and whose hedge is served like any normal
// request has an excess near 0; timer slack, scheduling and GC pauses show up as excess.
// Values in milliseconds, in send order; empty when no stalled id was answered or no
// normal request exists to take a median from.
func HedgeExcess(s Series, isStall func(id uint32) bool, threshold time.Duration) []float64 {
	var normal []float64
	for i, id := range s.IDs {
		if s.OK[i] && !isStall(id) {
			normal = append(normal, s.LatenciesUS[i]/1000)
		}
	}
	if len(normal) == 0 {
		return nil
	}
	slices.Sort(normal)
	median := Percentile(normal, 50)
	thr := float64(threshold) / float64(time.Millisecond)
	var out []float64
	for i, id := range s.IDs {
		if s.OK[i] && isStall(id) {
			out = append(out, s.LatenciesUS[i]/1000-thr-median)
		}
	}
	return out
}

// Spread is a figure over repeated runs: its median and range.
type Spread struct{ Median, Min, Max float64 }

// MedianSummaries combines the summaries of repeated runs (runs[i] is run i's summaries,
// the same series in the same order) into one summary per series whose figures are the
// medians over the runs, plus the spread of P99.9 and MAX per series. Series missing from
// a run are an error: the runs must be repeats of one scenario.
func MedianSummaries(runs [][]Summary) ([]Summary, map[string][2]Spread, error) {
	if len(runs) == 0 {
		return nil, nil, errors.New("median of no runs")
	}
	out := make([]Summary, len(runs[0]))
	spread := map[string][2]Spread{}
	for i, first := range runs[0] {
		var p50, p95, p99, p999, mx, load []float64
		for r, run := range runs {
			if len(run) != len(runs[0]) || run[i].Name != first.Name {
				return nil, nil, fmt.Errorf("run %d does not have series %q at position %d", r+1, first.Name, i)
			}
			s := run[i]
			p50, p95, p99, p999 = append(p50, s.P50), append(p95, s.P95), append(p99, s.P99), append(p999, s.P999)
			mx, load = append(mx, s.Max), append(load, s.ExtraLoad)
		}
		out[i] = first
		out[i].P50, out[i].P95, out[i].P99 = Median(p50), Median(p95), Median(p99)
		out[i].P999, out[i].Max, out[i].ExtraLoad = Median(p999), Median(mx), Median(load)
		spread[first.Name] = [2]Spread{spreadOf(p999), spreadOf(mx)}
	}
	return out, spread, nil
}

// Median is the median of v: its middle value, or the mean of the two middle values for
// an even count; NaN when v is empty or holds a NaN (a run without a figure makes the
// median unknown rather than wrong). v is not changed.
func Median(v []float64) float64 {
	if len(v) == 0 || slices.ContainsFunc(v, math.IsNaN) {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// MedianDuration is Median over durations (the mean of the two middle ones for an even
// count, to the nanosecond); 0 when d is empty. d is not changed.
func MedianDuration(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	v := make([]float64, len(d))
	for i, x := range d {
		v[i] = float64(x)
	}
	return time.Duration(Median(v))
}

func spreadOf(v []float64) Spread {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return Spread{math.NaN(), math.NaN(), math.NaN()}
	}
	return Spread{Median(s), s[0], s[len(s)-1]}
}
