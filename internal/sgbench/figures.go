package sgbench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
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
		"sg-tail-quiet": {Results: "sg-tail-quiet", Command: "kedge bench sg --scenario tail --modes straggle --fanouts 64 --rounds 3 --before BEFORE --out docs/results/sg-tail-quiet",
			Render: tailFigures},
		"sg-tail-quiet-loss": {Results: "sg-tail-quiet-loss", Command: "kedge bench sg --scenario tail --modes loss --fanouts 16,64 --rounds 3 --before BEFORE --out docs/results/sg-tail-quiet-loss",
			Render: tailFigures},
		"sg-loopback": {Results: "sg-loopback", Command: "kedge bench sg --scenario loopback --before BEFORE --out docs/results/sg-loopback",
			Render: loopFigures},
		"sg-loopback-steps": {Results: "sg-loopback-steps", Command: "kedge bench sg --scenario loopback --fanouts 4 --before BEFORE (one run per change; steps.json)",
			Render: loopStepFigures},
	}
}

// tailFigures is WriteTailMarkdown of a tail scenario's result.
var tailFigures = dated(TailSchema, func(r *TailResult) time.Time { return r.Timestamp }, WriteTailMarkdown)

// loopFigures is WriteLoopMarkdown of a loopback scenario's result.
var loopFigures = dated(LoopSchema, func(r *LoopResult) time.Time { return r.Timestamp }, WriteLoopMarkdown)

// dated renders dir/result.json (of schema) with write, after the run's date.
func dated[T any](schema string, when func(*T) time.Time, write func(io.Writer, *T)) func(dir string) (string, error) {
	return func(dir string) (string, error) {
		var r T
		if err := docfigures.ReadResult(filepath.Join(dir, "result.json"), schema, &r); err != nil {
			return "", err
		}
		var b strings.Builder
		fmt.Fprintf(&b, "%s. ", when(&r).Format(time.DateOnly))
		write(&b, &r)
		return b.String(), nil
	}
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

// LoopStep is one entry of a steps.json: a loopback run (its directory) of one change
// against the build before it.
type LoopStep struct {
	Dir    string `json:"dir"`
	Change string `json:"change"`
	Commit string `json:"commit"`
	Before string `json:"before"`
}

// loopStepFigures renders each step's after/before ratios (medians of the rounds' ratios,
// their range) at every outstanding count of its run.
func loopStepFigures(dir string) (string, error) {
	raw, err := os.ReadFile(filepath.Join(dir, "steps.json"))
	if err != nil {
		return "", err
	}
	var steps []LoopStep
	if err := json.Unmarshal(raw, &steps); err != nil {
		return "", fmt.Errorf("%s/steps.json: %w", dir, err)
	}
	var b strings.Builder
	b.WriteString("| change (commit, against) | fan-out | outstanding | req/s after/before (rounds) | CPU/req after/before (rounds) |\n|---|---|---|---|---|\n")
	for _, st := range steps {
		var r LoopResult
		if err := docfigures.ReadResult(filepath.Join(dir, st.Dir, "result.json"), LoopSchema, &r); err != nil {
			return "", err
		}
		for _, s := range r.Summary {
			if s.Method != "kedge" || s.VsBeforeRPS == 0 {
				continue
			}
			var rr, cr []float64
			for _, a := range r.Rows {
				for _, c := range r.Rows {
					if a.Method == "kedge" && c.Method == "kedge-before" && a.Round == c.Round && a.Fanout == s.Fanout && c.Fanout == s.Fanout &&
						a.Outstanding == s.Outstanding && c.Outstanding == s.Outstanding && c.ReqPerSec > 0 && c.CPUUSPerReq > 0 {
						rr, cr = append(rr, a.ReqPerSec/c.ReqPerSec), append(cr, a.CPUUSPerReq/c.CPUUSPerReq)
					}
				}
			}
			fmt.Fprintf(&b, "| %s (%s, against %s) | %d | %d | %.2fx (%.2f-%.2f) | %.2fx (%.2f-%.2f) |\n", st.Change, st.Commit, st.Before,
				s.Fanout, s.Outstanding, s.VsBeforeRPS, slices.Min(rr), slices.Max(rr), s.VsBeforeCPU, slices.Min(cr), slices.Max(cr))
		}
	}
	return b.String(), nil
}
