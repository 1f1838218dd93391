package bench

import (
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// ReportOptions controls WriteReport.
type ReportOptions struct {
	// Baseline names the series P99 reductions are computed against.
	Baseline string
	// IsStall tells which ids the server stalls; with HedgeDelay it enables the hedge-excess
	// lines. Nil skips them.
	IsStall    func(id uint32) bool
	HedgeDelay time.Duration
}

// WriteReport prints the table of r's series, then per series the timeouts, late duplicates
// and (with opt.IsStall, for all but the baseline) the hedge excess of the stalled requests.
func WriteReport(w io.Writer, r Result, opt ReportOptions) error {
	sums := make([]Summary, len(r.Series))
	for i, s := range r.Series {
		sums[i] = Summarize(s)
	}
	if err := WriteTable(w, sums, opt.Baseline); err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%s, %d measured requests per series, %s\n", r.Scenario, maxRequests(r.Series), r.Describe())
	for _, s := range r.Series {
		fmt.Fprintf(&b, "%s: %d timeouts, %d late duplicates (%d answered twice)", s.Name, s.Timeouts, s.LateDuplicates, s.Duplicates)
		if s.HedgesSent != nil {
			fmt.Fprintf(&b, ", %d hedges sent", *s.HedgesSent)
		}
		if opt.IsStall != nil && s.Name != opt.Baseline {
			ex := HedgeExcess(s, opt.IsStall, opt.HedgeDelay)
			if len(ex) > 0 {
				slices.Sort(ex)
				fmt.Fprintf(&b, "; hedge excess over %v + median on %d stalled ids: P50 %.2f ms, MAX %.2f ms",
					opt.HedgeDelay, len(ex), Percentile(ex, 50), ex[len(ex)-1])
			}
		}
		b.WriteString("\n")
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

func maxRequests(ss []Series) int {
	n := 0
	for _, s := range ss {
		n = max(n, s.Requests())
	}
	return n
}

// WriteCharts writes the two latency charts of r into dir: cdf.{png,svg}, the whole CDF
// (Figure 4.1), and tail.{png,svg}, the CDF from tailFrom to 1 (Figure 4.2). A positive
// hedgeDelay is drawn as a reference line.
func WriteCharts(dir string, r Result, tailFrom float64, hedgeDelay time.Duration) error {
	var markers []Marker
	if hedgeDelay > 0 {
		markers = []Marker{{X: float64(hedgeDelay) / float64(time.Millisecond), Label: "hedge delay " + hedgeDelay.String()}}
	}
	if err := WriteCDF(filepath.Join(dir, "cdf"), r.Series, ChartOptions{
		Title: "Latency CDF - " + r.Scenario, Markers: markers}); err != nil {
		return err
	}
	return WriteCDF(filepath.Join(dir, "tail"), r.Series, ChartOptions{
		Title:   fmt.Sprintf("Latency CDF, tail from P%g - %s", tailFrom*100, r.Scenario),
		YMin:    tailFrom,
		Markers: markers,
	})
}
