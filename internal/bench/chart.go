package bench

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// ChartOptions shapes a latency CDF chart.
type ChartOptions struct {
	Title string
	// YMin is the lowest cumulative fraction shown: 0 for the whole CDF (Figure 4.1),
	// e.g. 0.95 for a zoom on the tail (Figure 4.2).
	YMin float64
	// Markers are vertical reference lines, e.g. the hedge delay.
	Markers []Marker
}

// Marker is a labelled vertical line at X milliseconds.
type Marker struct {
	X     float64
	Label string
}

// lineStyles keeps series apart in colour and in dash pattern, so that charts also read
// in greyscale print. The first style (solid black) goes to the first series, normally
// the baseline.
var lineStyles = []struct {
	color  color.Color
	dashes []vg.Length
}{
	{color.RGBA{A: 255}, nil},
	{color.RGBA{R: 31, G: 119, B: 180, A: 255}, []vg.Length{vg.Points(6), vg.Points(3)}},
	{color.RGBA{R: 44, G: 160, B: 44, A: 255}, []vg.Length{vg.Points(1.5), vg.Points(2.5)}},
	{color.RGBA{R: 214, G: 39, B: 40, A: 255}, []vg.Length{vg.Points(8), vg.Points(3), vg.Points(2), vg.Points(3)}},
	{color.RGBA{R: 148, G: 103, B: 189, A: 255}, []vg.Length{vg.Points(3), vg.Points(3)}},
	{color.RGBA{R: 255, G: 127, B: 14, A: 255}, []vg.Length{vg.Points(10), vg.Points(4)}},
}

// WriteCDF draws the latency CDF of each series on a logarithmic millisecond axis and
// writes it as base+".png" and base+".svg".
func WriteCDF(base string, series []Series, opt ChartOptions) error {
	if len(series) == 0 {
		return errors.New("write chart: no series")
	}
	p := plot.New()
	p.Title.Text = opt.Title
	p.X.Label.Text = "latency (ms, log scale)"
	p.Y.Label.Text = "fraction of requests answered within latency"
	p.X.Scale = plot.LogScale{}
	p.Y.Min, p.Y.Max = opt.YMin, 1
	p.Add(plotter.NewGrid())
	p.Legend.Top, p.Legend.Left = false, false
	p.Legend.XOffs, p.Legend.YOffs = -vg.Points(6), vg.Points(6)
	p.Legend.Padding = vg.Points(2)

	xmin, xmax := math.Inf(1), math.Inf(-1)
	for i, s := range series {
		pts := cdfPoints(s.LatenciesUS, opt.YMin)
		if len(pts) == 0 {
			continue
		}
		xmin, xmax = min(xmin, pts[0].X), max(xmax, pts[len(pts)-1].X)
		l, err := plotter.NewLine(pts)
		if err != nil {
			return fmt.Errorf("write chart: series %q: %w", s.Name, err)
		}
		st := lineStyles[i%len(lineStyles)]
		l.Color, l.Dashes, l.Width = st.color, st.dashes, vg.Points(1.6)
		p.Add(l)
		p.Legend.Add(s.Name, l)
	}
	if math.IsInf(xmin, 1) {
		return errors.New("write chart: no latencies to draw")
	}
	for _, m := range opt.Markers {
		xmin, xmax = min(xmin, m.X), max(xmax, m.X)
	}
	// Widen the axis to the 1-2-5 values around the data, so both ends carry a label.
	p.X.Min, p.X.Max = nice125(xmin, false), nice125(xmax*1.02, true)
	p.X.Tick.Marker = logTicks125{}
	if opt.YMin > 0 {
		p.Y.Tick.Marker = fractionTicks{}
	}
	for _, m := range opt.Markers {
		l, err := plotter.NewLine(plotter.XYs{{X: m.X, Y: opt.YMin}, {X: m.X, Y: 1}})
		if err != nil {
			return fmt.Errorf("write chart: marker: %w", err)
		}
		l.Color = color.Gray{Y: 128}
		l.Dashes = []vg.Length{vg.Points(1), vg.Points(3)}
		p.Add(l)
		p.Legend.Add(m.Label, l)
	}
	return SavePlot(p, 8*vg.Inch, 5*vg.Inch, base)
}

// SavePlot writes p as base.png and base.svg, w by h.
func SavePlot(p *plot.Plot, w, h vg.Length, base string) error {
	for _, ext := range []string{".png", ".svg"} {
		if err := p.Save(w, h, base+ext); err != nil {
			return fmt.Errorf("write chart %s: %w", base+ext, err)
		}
	}
	return nil
}

// cdfPoints returns the empirical CDF of latencies (µs) in ms as a step line, keeping
// only the part at or above ymin (the line starts at ymin there).
func cdfPoints(latUS []float64, ymin float64) plotter.XYs {
	ms := make([]float64, len(latUS))
	for i, v := range latUS {
		ms[i] = v / 1000
	}
	slices.Sort(ms)
	n := float64(len(ms))
	pts := make(plotter.XYs, 0, 2*len(ms))
	for i, x := range ms {
		x = max(x, 1e-3) // a log axis cannot show 0; 1 µs stands in for it
		lo, hi := float64(i)/n, float64(i+1)/n
		if hi < ymin {
			continue
		}
		pts = append(pts, plotter.XY{X: x, Y: max(lo, ymin)}, plotter.XY{X: x, Y: hi})
	}
	return pts
}

// nice125 rounds x > 0 down (up false) or up (up true) to a value 1, 2 or 5 times a power of ten.
func nice125(x float64, up bool) float64 {
	dec := math.Pow10(int(math.Floor(math.Log10(x))))
	if up {
		for _, m := range []float64{1, 2, 5, 10} {
			if dec*m >= x*(1-1e-12) {
				return dec * m
			}
		}
	}
	for _, m := range []float64{10, 5, 2, 1} {
		if dec*m <= x*(1+1e-12) {
			return dec * m
		}
	}
	return dec
}

// logTicks125 labels a logarithmic axis at 1, 2 and 5 times each power of ten, with minor
// ticks at the other integers, so a millisecond axis reads 1 2 5 10 20 50 100 ...
type logTicks125 struct{}

func (logTicks125) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for dec := math.Pow10(int(math.Floor(math.Log10(lo)))); dec <= hi; dec *= 10 {
		for i := 1; i < 10; i++ {
			v := dec * float64(i)
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if i == 1 || i == 2 || i == 5 {
				t.Label = strconv.FormatFloat(v, 'g', -1, 64)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}

// fractionTicks labels a zoomed cumulative-fraction axis every 0.01 (every 0.001 when the
// range is narrower than 0.02).
type fractionTicks struct{}

func (fractionTicks) Ticks(lo, hi float64) []plot.Tick {
	step, decimals := 0.01, 2
	if hi-lo < 0.02 {
		step, decimals = 0.001, 3
	}
	var ticks []plot.Tick
	for k := math.Ceil(lo/step - 1e-9); k*step <= hi+1e-9; k++ {
		v := k * step
		ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', decimals, 64)})
	}
	return ticks
}

var (
	_ plot.Ticker = logTicks125{}
	_ plot.Ticker = fractionTicks{}
)
