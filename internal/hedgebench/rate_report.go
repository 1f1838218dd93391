package hedgebench

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// WriteRateReport prints the per-level table of r and what it means.
func WriteRateReport(w io.Writer, r RateResult) error {
	var b strings.Builder
	fmt.Fprintf(&b, "| Loops | req/s without | req/s with | P50 without (µs) | P50 with | ΔP50 (µs) | P99 without (µs) | P99 with | ΔP99 (µs) | CPU/req without (µs) | CPU/req with | chaos req/s | stalled | missed hedges | budget refusals | lost clones |\n")
	fmt.Fprintf(&b, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, l := range r.Levels {
		fmt.Fprintf(&b, "| %d | %.0f | %.0f | %.1f | %.1f | %+.1f | %.1f | %.1f | %+.1f | %.1f | %.1f | %.0f | %d | %d | %d | %d |\n",
			l.Concurrency, l.OffRPS, l.OnRPS, l.OffP50US, l.OnP50US, l.DeltaP50US, l.OffP99US, l.OnP99US, l.DeltaP99US,
			l.OffCPUPerReqUS, l.OnCPUPerReqUS, l.ChaosRPS, l.Stalled, l.Missed, l.BudgetExhausted, l.LostClones)
	}
	fmt.Fprintf(&b, "\nrate, %v requests per run, %v pairs per level, backend %s, %s",
		r.Parameters["n"], r.Parameters["repeats"], r.Backend, r.Describe())
	fmt.Fprintf(&b, "\nidle (no traffic): %.3f CPUs busy without kedge, %.3f with kedge attached\n", r.IdleCPUOff, r.IdleCPUOn)
	b.WriteString("Δ = with minus without, median of the paired runs; latencies of requests answered at once;\n" +
		"CPU/req = busy CPU time of the whole machine (client, server, stack, kedge) per request.\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// writeRateCharts draws latency and throughput against concurrency, with and without kedge.
func writeRateCharts(dir string, r RateResult) error {
	pick := func(f func(RateLevel) float64) plotter.XYs {
		xy := make(plotter.XYs, len(r.Levels))
		for i, l := range r.Levels {
			xy[i].X, xy[i].Y = float64(l.Concurrency), f(l)
		}
		return xy
	}
	type line struct {
		name string
		xy   plotter.XYs
	}
	charts := []struct {
		file, title, ylabel string
		lines               []line
	}{
		{"latency", "Fast-path latency with and without kedge", "latency (µs)", []line{
			{"P50 without kedge", pick(func(l RateLevel) float64 { return l.OffP50US })},
			{"P50 with kedge", pick(func(l RateLevel) float64 { return l.OnP50US })},
			{"P99 without kedge", pick(func(l RateLevel) float64 { return l.OffP99US })},
			{"P99 with kedge", pick(func(l RateLevel) float64 { return l.OnP99US })},
		}},
		{"throughput", "Requests per second with and without kedge", "requests/s", []line{
			{"without kedge", pick(func(l RateLevel) float64 { return l.OffRPS })},
			{"with kedge", pick(func(l RateLevel) float64 { return l.OnRPS })},
			{"with kedge, 2% stalls hedged", pick(func(l RateLevel) float64 { return l.ChaosRPS })},
		}},
	}
	colors := []color.Color{color.Black, color.RGBA{R: 214, G: 39, B: 40, A: 255},
		color.RGBA{R: 31, G: 119, B: 180, A: 255}, color.RGBA{R: 44, G: 160, B: 44, A: 255}}
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
		for i, l := range c.lines {
			ln, pts, err := plotter.NewLinePoints(l.xy)
			if err != nil {
				return fmt.Errorf("rate chart %s: %w", c.file, err)
			}
			ln.Color, pts.Color = colors[i%len(colors)], colors[i%len(colors)]
			if i%2 == 1 {
				ln.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
			}
			p.Add(ln, pts)
			p.Legend.Add(l.name, ln, pts)
		}
		for _, ext := range []string{".png", ".svg"} {
			if err := p.Save(8*vg.Inch, 5*vg.Inch, filepath.Join(dir, c.file+ext)); err != nil {
				return errors.Join(fmt.Errorf("write chart %s%s", c.file, ext), err)
			}
		}
	}
	return nil
}
