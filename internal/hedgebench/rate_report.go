package hedgebench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// cpuTimes is the machine-wide CPU time of /proc/stat's "cpu" line.
type cpuTimes struct {
	busy, softirq time.Duration // every state but idle and iowait; softirq alone
	wall          time.Duration // when read (monotonic), for rates
}

// userHZ is the unit of /proc/stat (USER_HZ, 100 on every Linux architecture kedge runs on).
const userHZ = 100

var monoStart = time.Now()

func readCPU() (cpuTimes, error) { return readCPUFrom("/proc/stat") }

func readCPUFrom(path string) (cpuTimes, error) {
	f, err := os.Open(path)
	if err != nil {
		return cpuTimes{}, fmt.Errorf("read CPU times: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 8 || fields[0] != "cpu" {
			continue
		}
		// user nice system idle iowait irq softirq [steal guest guest_nice]; guest time is
		// already part of user.
		var t cpuTimes
		for i, f := range fields[1:min(len(fields), 9)] {
			v, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				return cpuTimes{}, fmt.Errorf("read CPU times: %s: field %d %q: %w", path, i+1, f, err)
			}
			d := time.Duration(v) * time.Second / userHZ
			switch i {
			case 3, 4: // idle, iowait
			case 6:
				t.softirq = d
				t.busy += d
			default:
				t.busy += d
			}
		}
		t.wall = time.Since(monoStart)
		return t, nil
	}
	return cpuTimes{}, fmt.Errorf("read CPU times: no cpu line in %s", path)
}

func (a cpuTimes) sub(b cpuTimes) cpuTimes {
	return cpuTimes{busy: a.busy - b.busy, softirq: a.softirq - b.softirq, wall: a.wall - b.wall}
}

// idleCPU measures the busy CPUs over d while nothing is sent.
func idleCPU(ctx context.Context, d time.Duration) (float64, error) {
	a, err := readCPU()
	if err != nil {
		return 0, err
	}
	select {
	case <-time.After(d):
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	b, err := readCPU()
	if err != nil {
		return 0, err
	}
	c := b.sub(a)
	return c.busy.Seconds() / c.wall.Seconds(), nil
}

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
	fmt.Fprintf(&b, "\nrate, %v requests per run, %v pairs per level, backend %s, kernel %s, %s (%d CPUs), commit %.12s",
		r.Parameters["n"], r.Parameters["repeats"], r.Backend, r.Kernel, r.Machine.CPUModel, r.Machine.NProc, r.Commit)
	if len(r.LoadAvg) == 3 {
		fmt.Fprintf(&b, ", load average %.2f %.2f %.2f at start", r.LoadAvg[0], r.LoadAvg[1], r.LoadAvg[2])
	}
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
