package sgbench

import (
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotutil"
)

func addLines(p *plot.Plot, args ...any) error { return plotutil.AddLinePoints(p, args...) }
