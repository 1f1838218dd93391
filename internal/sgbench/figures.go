package sgbench

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/kedge-dev/kedge/internal/docfigures"
)

// FigureBlocks are the scatter-gather figure blocks of the documents (docs/benchmarks.md,
// docs/sg.md), rendered from docs/results/sg; tools/docfigures rewrites them.
func FigureBlocks() map[string]docfigures.Block {
	cmd := "kedge bench sg --duration 5s --lat-requests 500 --timeout 1s --out docs/results/sg"
	return map[string]docfigures.Block{
		"sg":        {Results: "sg", Command: cmd, Render: figures},
		"sg-ratios": {Results: "sg", Command: cmd, Render: ratioFigures},
		"sg-tail": {Results: "sg-tail", Command: "kedge bench sg --scenario tail --modes straggle --out docs/results/sg-tail",
			Render: tailFigures},
		"sg-tail-loss": {Results: "sg-tail-loss", Command: "kedge bench sg --scenario tail --modes loss --out docs/results/sg-tail-loss",
			Render: tailFigures},
	}
}

// tailFigures is WriteTailMarkdown of a tail scenario's result.
func tailFigures(dir string) (string, error) {
	var r TailResult
	if err := docfigures.ReadResult(filepath.Join(dir, "result.json"), TailSchema, &r); err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s. ", r.Timestamp.Format(time.DateOnly))
	WriteTailMarkdown(&b, &r)
	return b.String(), nil
}

// ReadResult reads dir/result.json.
func ReadResult(dir string) (*Result, error) {
	var r Result
	if err := docfigures.ReadResult(filepath.Join(dir, "result.json"), Schema, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// figures is WriteMarkdown of the result: every row and the ratios.
func figures(dir string) (string, error) {
	r, err := ReadResult(dir)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s. ", r.Timestamp.Format(time.DateOnly))
	WriteMarkdown(&b, r)
	return b.String(), nil
}

// ratioFigures is kedge against the best baseline per fan-out, one line per fan-out.
func ratioFigures(dir string) (string, error) {
	r, err := ReadResult(dir)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "From [results/sg](results/sg) (%s, commit %.12s; the best baseline of the same run at each fan-out):\n\n", r.Timestamp.Format(time.DateOnly), r.Commit)
	b.WriteString("| Fan-out | Throughput, kedge / best baseline | p50, kedge / best baseline |\n|---:|---|---|\n")
	for _, q := range r.Ratios {
		if q.Method != "" && q.Method != "kedge" {
			continue
		}
		fmt.Fprintf(&b, "| %d | %.2fx (%s) | %.2fx (%s) |\n", q.Fanout, q.ThroughputRatio, q.BestThroughput, q.P50Ratio, q.BestP50)
	}
	return b.String(), nil
}
