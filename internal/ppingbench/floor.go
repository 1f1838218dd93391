package ppingbench

import (
	"errors"
	"fmt"
	"image/color"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/kedge-dev/kedge/internal/bench"
)

// EPPing is the anchor of the cost target: ePPing's per-packet run time on this setup
// (the same router, forwarded iperf3, offloads off, 100 ms sampling, bpf_stats), measured
// side by side with kedge in an earlier sitting (three alternating rounds; ePPing's source
// is not available to run it again here). The target is half of it at each hook.
var EPPing = struct{ IngressNs, EgressNs [2]float64 }{
	IngressNs: [2]float64{222, 225},
	EgressNs:  [2]float64{265, 288},
}

// Hook names of a paired run.
const (
	HookTCIngress  = "TC ingress (data)"
	HookXDPIngress = "XDP ingress (data)"
	HookTCEgress   = "TC egress (ACKs)"
)

// Pair is one hook's figures from a kedge run and the empty programs' run beside it (same
// round, same hook).
type Pair struct {
	Round      int // from 1
	Hook       string
	EmptyFirst bool    // the empty programs ran before kedge's in this round
	KedgeNs    float64 // per packet
	EmptyNs    float64
	// MissPct is, at egress, the share of kedge's egress packets that went the full way
	// and found no identifier to match (match_miss), in percent; -1 when the run has no
	// counters.
	MissPct float64
	// Retired is, at egress, the identifiers kedge's egress program retired (ts_retired:
	// older than an echo that arrived); -1 when the run has no counters.
	Retired int64
	// KedgePerACK and EmptyPerACK are, at egress, the ingress packets (data segments) per
	// egress packet (ACK) of each run: the rarer the ACKs, the colder the egress program's
	// code and data when one comes (0 at ingress).
	KedgePerACK, EmptyPerACK float64
}

// Above is kedge's cost above the floor in this pair.
func (p Pair) Above() float64 { return p.KedgeNs - p.EmptyNs }

// Pairs returns, per round, each hook's kedge figure beside its empty programs' figure:
// TC ingress and TC egress from the TC runs, XDP ingress from the XDP runs. A result
// without empty runs gives none.
func (r *Result) Pairs() []Pair {
	var out []Pair
	round := 0
	var pending *RunResult // a run with statistics waiting for its partner
	for i := range r.Runs {
		run := &r.Runs[i]
		if run.Program == ProgramStack {
			pending = nil
			continue
		}
		if !run.Stats {
			if !run.Monitor {
				round++
			}
			pending = nil
			continue
		}
		if pending == nil || pending.IngressHook != run.IngressHook || (pending.Program == ProgramEmpty) == (run.Program == ProgramEmpty) {
			pending = run
			continue
		}
		k, e := pending, run
		if k.Program == ProgramEmpty {
			k, e = e, k
		}
		first := pending.Program == ProgramEmpty
		pending = nil
		if k.Ingress == nil || e.Ingress == nil || k.Egress == nil || e.Egress == nil {
			continue
		}
		if k.IngressHook == "xdp" {
			out = append(out, Pair{round, HookXDPIngress, first, k.Ingress.NsPerPacket, e.Ingress.NsPerPacket, -1, -1, 0, 0})
			continue
		}
		out = append(out,
			Pair{round, HookTCIngress, first, k.Ingress.NsPerPacket, e.Ingress.NsPerPacket, -1, -1, 0, 0},
			Pair{round, HookTCEgress, first, k.Egress.NsPerPacket, e.Egress.NsPerPacket, missPct(k), retired(k), perACK(k), perACK(e)})
	}
	return out
}

// missPct is the share of a run's egress packets counted match_miss, in percent (-1: no
// counters).
func missPct(run *RunResult) float64 {
	eg := run.Counters["egress"]
	if eg["pkts"] == 0 {
		return -1
	}
	return 100 * float64(eg["match_miss"]) / float64(eg["pkts"])
}

// perACK is a run's ingress packets per egress packet (0 without egress packets).
func perACK(run *RunResult) float64 {
	if run.Egress.Runs == 0 {
		return 0
	}
	return float64(run.Ingress.Runs) / float64(run.Egress.Runs)
}

// retired is a run's egress ts_retired count (-1: no counters; runs record only counters
// that are not zero, so a run from before the counter reads 0).
func retired(run *RunResult) int64 {
	eg := run.Counters["egress"]
	if eg["pkts"] == 0 {
		return -1
	}
	return int64(eg["ts_retired"])
}

var floorHooks = []string{HookTCIngress, HookXDPIngress, HookTCEgress}

// WriteFloorChart draws each hook's per-packet run time per round, kedge's programs beside
// the empty ones, with half of ePPing's figures marked, as base+".png" and base+".svg".
func (r *Result) WriteFloorChart(base string) error {
	pairs := r.Pairs()
	if len(pairs) == 0 {
		return errors.New("write floor chart: no runs of the empty programs")
	}
	p := plot.New()
	p.Title.Text = "pping: run time per packet, kedge beside an empty program on the same hook"
	p.Y.Label.Text = "ns per packet (bpf_stats run_time_ns / run_cnt)"
	p.Y.Min = 0
	p.NominalX(floorHooks...)
	p.Add(plotter.NewGrid())
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.XOffs = vg.Points(50)
	// Room above the highest point for the legend.
	for _, q := range pairs {
		p.Y.Max = max(p.Y.Max, 1.4*q.KedgeNs, 1.4*q.EmptyNs, EPPing.EgressNs[1])
	}
	const dx = 0.17
	series := []struct {
		name  string
		off   float64
		value func(Pair) float64
		col   color.Color
		shape draw.GlyphDrawer
	}{
		{"kedge pping (one point per round)", -dx, func(q Pair) float64 { return q.KedgeNs }, color.RGBA{R: 31, G: 119, B: 180, A: 255}, draw.CircleGlyph{}},
		{"empty program, the floor (one point per round)", dx, func(q Pair) float64 { return q.EmptyNs }, color.RGBA{A: 255}, draw.SquareGlyph{}},
	}
	for _, s := range series {
		var pts plotter.XYs
		for _, q := range pairs {
			for i, h := range floorHooks {
				if q.Hook == h {
					pts = append(pts, plotter.XY{X: float64(i) + s.off, Y: s.value(q)})
				}
			}
		}
		sc, err := plotter.NewScatter(pts)
		if err != nil {
			return fmt.Errorf("write floor chart: %w", err)
		}
		sc.GlyphStyle.Color, sc.GlyphStyle.Shape, sc.GlyphStyle.Radius = s.col, s.shape, vg.Points(3.5)
		p.Add(sc)
		p.Legend.Add(s.name, sc)
	}
	// Half of ePPing's figure (the target) over the hooks it was measured at; the XDP
	// ingress program is held to the ingress figure.
	half := map[string]float64{
		HookTCIngress:  EPPing.IngressNs[0] / 2,
		HookXDPIngress: EPPing.IngressNs[0] / 2,
		HookTCEgress:   EPPing.EgressNs[0] / 2,
	}
	for i, h := range floorHooks {
		l, err := plotter.NewLine(plotter.XYs{{X: float64(i) - 0.4, Y: half[h]}, {X: float64(i) + 0.4, Y: half[h]}})
		if err != nil {
			return fmt.Errorf("write floor chart: %w", err)
		}
		l.Color, l.Width, l.Dashes = color.RGBA{R: 214, G: 39, B: 40, A: 255}, vg.Points(1.4), []vg.Length{vg.Points(5), vg.Points(3)}
		p.Add(l)
		if i == 0 {
			p.Legend.Add("target: half of ePPing's figure (lower end)", l)
		}
	}
	return bench.SavePlot(p, 8*vg.Inch, 5*vg.Inch, base)
}

// floorFigures is the per-round table of the committed floor run: each hook's kedge figure,
// the empty program's beside it and the difference, with the target.
func floorFigures(dir string) (string, error) {
	r, err := ReadResult(filepath.Join(dir, floorRun.dir))
	if err != nil {
		return "", err
	}
	pairs := r.Pairs()
	if len(pairs) == 0 {
		return "", fmt.Errorf("%s: no runs of the empty programs", floorRun.dir)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Run: [%s](results/pping/%s/result.json) (`kedge bench pping %s`): %s, commit %.12s, load %.1f at start; chart: [cost.svg](results/pping/%s/cost.svg).\n\n",
		floorRun.dir, floorRun.dir, floorRun.flags, r.Timestamp.Format("2006-01-02 15:04 MST"), r.Commit, load1(r.Envelope), floorRun.dir)
	b.WriteString("| Round (first) | Hook | kedge ns/packet | empty program ns/packet | kedge above the floor | kedge's packets that went the full way and missed (match_miss) | identifiers retired by a later echo (ts_retired) | data segments per ACK, kedge / empty |\n|---|---|---:|---:|---:|---:|---:|---:|\n")
	for _, q := range pairs {
		first := "kedge"
		if q.EmptyFirst {
			first = "empty"
		}
		miss := "-"
		if q.MissPct >= 0 {
			miss = fmt.Sprintf("%.1f %%", q.MissPct)
		}
		ret := "-"
		if q.Retired >= 0 {
			ret = fmt.Sprint(q.Retired)
		}
		ratio := "-"
		if q.KedgePerACK > 0 && q.EmptyPerACK > 0 {
			ratio = fmt.Sprintf("%.0f / %.0f", q.KedgePerACK, q.EmptyPerACK)
		}
		fmt.Fprintf(&b, "| %d (%s) | %s | %.0f | %.0f | %+.0f | %s | %s | %s |\n", q.Round, first, q.Hook, q.KedgeNs, q.EmptyNs, q.Above(), miss, ret, ratio)
	}
	s := r.Summarize()
	f := s.Floor
	fmt.Fprintf(&b, "\n| Hook, over all rounds (weighted by packets) | kedge | empty program | kedge above the floor | ePPing (anchor) | target: half of ePPing | floor / target |\n|---|---:|---:|---:|---:|---:|---:|\n")
	row := func(hook string, k, e float64, anchor [2]float64) {
		fmt.Fprintf(&b, "| %s | %.0f | %.0f | %+.0f | %.0f-%.0f | %.0f-%.0f | %.2f-%.2f |\n", hook, k, e, k-e,
			anchor[0], anchor[1], anchor[0]/2, anchor[1]/2, e/(anchor[1]/2), e/(anchor[0]/2))
	}
	row(HookTCIngress, s.IngressNs, f.IngressNs, EPPing.IngressNs)
	if f.XDPIngressPackets > 0 {
		row(HookXDPIngress, s.XDPIngressNs, f.XDPIngressNs, EPPing.IngressNs)
	}
	row(HookTCEgress, s.EgressNs, f.EgressNs, EPPing.EgressNs)
	return b.String(), nil
}
