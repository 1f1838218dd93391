package sgbench

import (
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/kedge-dev/kedge/internal/bench"
)

func addLines(p *plot.Plot, args ...any) error { return plotutil.AddLinePoints(p, args...) }

// saveFanoutChart draws the (name, points) pairs of args as lines on log-log axes against
// fan-out and writes them to base.png and base.svg.
func saveFanoutChart(base, title, x, y string, args []any) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text, p.Y.Label.Text = x, y
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{}, plot.LogTicks{}
	if err := addLines(p, args...); err != nil {
		return err
	}
	p.Legend.Top = true
	return bench.SavePlot(p, 7*vg.Inch, 4.5*vg.Inch, base)
}
