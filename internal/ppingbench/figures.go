package ppingbench

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/docfigures"
)

// figureRuns are the committed runs of the pping table, in its order: the directory
// under docs/results/pping and the flags that made it.
var figureRuns = []struct{ dir, flags string }{
	{"ratelimit-100ms", "--rounds 3"},
	{"ratelimit-0", "--rate-limit 0 --rounds 3"},
	{"offloads-on", "--offloads --rounds 2"},
	{"tcp-only", "--tcp-only --rounds 3"},
}

// floorRun is the committed run whose empty programs' runs give the floor table
// (pping-floor): the first row's.
var floorRun = figureRuns[0]

// FigureBlocks are the pping figure blocks of the documents (docs/pping.md,
// docs/benchmarks.md), rendered from docs/results/pping; tools/docfigures rewrites them.
func FigureBlocks() map[string]docfigures.Block {
	return map[string]docfigures.Block{
		"pping":       {Results: "pping", Command: "kedge bench pping " + figureRuns[0].flags + " --out docs/results/pping/" + figureRuns[0].dir + " (and the other rows' flags)", Render: figures},
		"pping-floor": {Results: "pping", Command: "kedge bench pping " + floorRun.flags + " --out docs/results/pping/" + floorRun.dir, Render: floorFigures},
		"pping-stack": {Results: "pping", Command: "kedge bench pping " + floorRun.flags + " --out docs/results/pping/" + floorRun.dir, Render: stackFigures},
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

// figures is one row per committed run: the forwarding rate without and with the
// monitor, the programs' run time per packet at each hook, and the samples delivered.
func figures(dir string) (string, error) {
	var b strings.Builder
	b.WriteString("| Configuration | Forwarded pps, off -> on | BPF ns/packet, ingress (data) | XDP ingress | Egress (ACKs) | Empty programs: ingress / XDP / egress | Samples/s | Run |\n|---|---:|---:|---:|---:|---:|---:|---|\n")
	for _, fr := range figureRuns {
		r, err := ReadResult(filepath.Join(dir, fr.dir))
		if err != nil {
			return "", err
		}
		s := r.Summarize()
		rl, _ := r.Parameters["rate_limit_ms"].(float64)
		rounds, _ := r.Parameters["rounds"].(float64)
		offloads, _ := r.Parameters["offloads"].(bool)
		// Older results name no sources: they tracked TCP, ICMP and DNS.
		sources, _ := r.Parameters["sources"].(string)
		if sources == "" {
			sources = "tsval,icmp,dns"
		}
		xdp := dash(s.XDPIngressNs, s.XDPIngressPackets)
		floor := "not run"
		if f := s.Floor; f.IngressPackets > 0 {
			floor = fmt.Sprintf("%.0f / %s / %.0f", f.IngressNs, dash(f.XDPIngressNs, f.XDPIngressPackets), f.EgressNs)
		}
		fmt.Fprintf(&b, "| `-r %g`, offloads %s, sources %s, %g rounds | %.1fk -> %.1fk (%+.1f %%) | %.0f | %s | %.0f | %s | %.1f | [%s](results/pping/%s/result.json): %s, commit %.12s, load %.1f |\n",
			rl, map[bool]string{true: "on", false: "off"}[offloads], sources, rounds, s.PPSOff/1000, s.PPSOn/1000, -s.ForwardingLossPct,
			s.IngressNs, xdp, s.EgressNs, floor, s.SamplesPerSec, fr.dir, fr.dir, r.Timestamp.Format(time.DateOnly), r.Commit, load1(r.Envelope))
	}
	return b.String(), nil
}

func load1(e bench.Envelope) float64 {
	if len(e.LoadAvg) == 0 {
		return 0
	}
	return e.LoadAvg[0]
}

// dash formats a per-packet figure, "-" when no packet was measured.
func dash(ns float64, pkts uint64) string {
	if pkts == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", ns)
}
