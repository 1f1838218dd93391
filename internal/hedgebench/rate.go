package hedgebench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/chaos"
	"github.com/kedge-dev/kedge/internal/hedge"
)

// RateOptions configure scenario (d): concurrent closed-loop clients at rising
// concurrency, each level measured without kedge and with it, in alternating order.
//
// Two chaos servers run on the server host. "fast" (port 9999) answers every request at
// once and never stalls: with it, the difference between the runs with and without kedge
// is the cost of kedge's fast path (splitter and clone, delay line, rescuer dropping the
// answered clone, response path) at that rate. "chaos" (port 9998) stalls StallPct of the
// ids for Stall: run with kedge only, it shows whether the hedger still rescues every
// stalled request (no missed hedges) and loses no clone at that rate.
type RateOptions struct {
	Levels   []int         // concurrent loops per level (1, 4, 16, 64)
	N        int           // measured requests per run (20000)
	Warmup   int           // per run, discarded (500)
	Repeats  int           // without/with pairs per level (3)
	Delay    time.Duration // hedge delay (10 ms)
	Timeout  time.Duration // client timeout (1 s)
	StallPct int           // chaos service: stalled ids (2)
	Stall    time.Duration // chaos service: stall (50 ms)
	Backend  string
	Exe      string
	OutDir   string
	Log      *slog.Logger
}

func (o *RateOptions) defaults() error {
	if len(o.Levels) == 0 {
		o.Levels = []int{1, 4, 16, 64}
	}
	for _, c := range o.Levels {
		if c < 1 || c > 1024 {
			return paramErrorf("concurrency level %d out of range 1-1024", c)
		}
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.N, 20000)
	def(&o.Warmup, 500)
	def(&o.Repeats, 3)
	def(&o.StallPct, 2)
	if o.Delay == 0 {
		o.Delay = 10 * time.Millisecond
	}
	if o.Timeout == 0 {
		o.Timeout = time.Second
	}
	if o.Stall == 0 {
		o.Stall = 50 * time.Millisecond
	}
	switch {
	case o.Repeats < 1 || o.Repeats > 10:
		return paramErrorf("repeats %d out of range 1-10", o.Repeats)
	case o.N < 100:
		return paramErrorf("%d requests per run: need at least 100", o.N)
	case o.Stall <= o.Delay:
		return paramErrorf("stall %v must exceed the hedge delay %v, or there is nothing to rescue", o.Stall, o.Delay)
	case o.Stall >= o.Timeout:
		return paramErrorf("stall %v must be below the timeout %v", o.Stall, o.Timeout)
	}
	// Every run gets its own id range of idSpan ids (see runClient).
	if runs := len(o.Levels) * o.Repeats * 3; uint64(runs+1)*idSpan > readyIDs {
		return paramErrorf("%d runs do not fit in 32-bit request ids: fewer levels or repeats", runs)
	}
	if uint64(o.N+o.Warmup)+uint64(max(len(o.Levels), 1))*100 > idSpan {
		return paramErrorf("%d requests per run: at most %d", o.N+o.Warmup, idSpan/2)
	}
	if o.Exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find kedge executable: %w", err)
		}
		o.Exe = exe
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.OutDir == "" {
		o.OutDir = filepath.Join("results", "hedge", Rate)
	}
	return os.MkdirAll(o.OutDir, 0o755)
}

const (
	idSpan   = 20_000_000    // ids per run
	readyIDs = 4_000_000_000 // waitReady's ids start here
)

// RateRun is one client run.
type RateRun struct {
	Concurrency int     `json:"concurrency"`
	Repeat      int     `json:"repeat"`
	Service     string  `json:"service"` // fast or chaos
	Kedge       bool    `json:"kedge"`
	Requests    int     `json:"requests"`
	ElapsedS    float64 `json:"elapsed_s"`
	RPS         float64 `json:"requests_per_s"`
	// Latency percentiles of the requests the server answers at once (every request of
	// the fast service, the non-stalled ones of the chaos service), in µs.
	P50US  float64 `json:"p50_us"`
	P99US  float64 `json:"p99_us"`
	P999US float64 `json:"p99_9_us"`
	MaxUS  float64 `json:"max_us"`
	// Timeouts and LateDuplicates as the application saw them.
	Timeouts       int `json:"timeouts"`
	LateDuplicates int `json:"late_duplicates"`
	// CPU: busy time of all CPUs during the run (/proc/stat), in CPUs (2.0 = both cores
	// busy), the softirq part of it, and busy CPU time per request in µs. Client, server,
	// network stack and kedge all count: the difference between the runs with and without
	// kedge is kedge's.
	CPUBusy     float64 `json:"cpu_busy"`
	CPUSoftirq  float64 `json:"cpu_softirq"`
	CPUPerReqUS float64 `json:"cpu_per_request_us"`
	// With kedge: the hedger's counters over the run (measured and warm-up requests).
	Counters map[string]uint64 `json:"counters,omitempty"`
	// LostClones is clones that entered the delay line and never left it, plus clones
	// the splitter failed to make.
	LostClones *uint64 `json:"lost_clones,omitempty"`
	// Chaos service: measured requests the server stalled, how many of them a hedge
	// answered before the stall ended, and the rest (missed hedges).
	Stalled     int     `json:"stalled,omitempty"`
	Rescued     int     `json:"rescued,omitempty"`
	Missed      *int    `json:"missed_hedges,omitempty"`
	RescueP50US float64 `json:"rescue_p50_us,omitempty"`
	RescueMaxUS float64 `json:"rescue_max_us,omitempty"`
}

// RateLevel summarises one concurrency level: medians over the repeats.
type RateLevel struct {
	Concurrency int     `json:"concurrency"`
	OffRPS      float64 `json:"off_requests_per_s"`
	OnRPS       float64 `json:"on_requests_per_s"`
	OffP50US    float64 `json:"off_p50_us"`
	OnP50US     float64 `json:"on_p50_us"`
	OffP99US    float64 `json:"off_p99_us"`
	OnP99US     float64 `json:"on_p99_us"`
	// DeltaP50US and DeltaP99US are the medians of the per-pair differences (with kedge
	// minus without).
	DeltaP50US     float64 `json:"delta_p50_us"`
	DeltaP99US     float64 `json:"delta_p99_us"`
	OffCPUPerReqUS float64 `json:"off_cpu_per_request_us"`
	OnCPUPerReqUS  float64 `json:"on_cpu_per_request_us"`
	// Chaos service with kedge, summed over the repeats.
	ChaosRPS   float64 `json:"chaos_requests_per_s"`
	Stalled    int     `json:"stalled"`
	Missed     int     `json:"missed_hedges"`
	LostClones uint64  `json:"lost_clones"`
	Timeouts   int     `json:"timeouts"`
	// BudgetExhausted is the chaos runs' budget refusals (missed hedges the budget chose).
	BudgetExhausted uint64 `json:"budget_exhausted"`
}

// RateResult is the rate scenario's result.json.
type RateResult struct {
	bench.Envelope
	Backend string `json:"backend"`
	// IdleCPU is the busy CPUs with no traffic, without kedge and with kedge attached
	// (the conveyor's fillers circulate whether or not requests flow).
	IdleCPUOff float64     `json:"idle_cpu_off"`
	IdleCPUOn  float64     `json:"idle_cpu_on"`
	Runs       []RateRun   `json:"runs"`
	Levels     []RateLevel `json:"levels"`
}

// RateSchema versions RateResult.
const RateSchema = "kedge.bench.rate/v1"

// RunRate runs scenario (d) and writes result.json and charts into o.OutDir.
func RunRate(ctx context.Context, o RateOptions) (RateResult, error) {
	var res RateResult
	if err := o.defaults(); err != nil {
		return res, err
	}
	l, client, srv, fast, slow, err := benchLab()
	if err != nil {
		return res, err
	}
	defer l.Close()
	stopFast, err := startServer(Options{Exe: o.Exe, Server: chaos.Config{StallPct: 0, Stall: o.Stall, TTL: time.Second}},
		srv, []netip.AddrPort{fast})
	if err != nil {
		return res, err
	}
	defer stopFast()
	stopSlow, err := startServer(Options{Exe: o.Exe, Server: chaos.Config{StallPct: o.StallPct, Stall: o.Stall, TTL: time.Second}},
		srv, []netip.AddrPort{slow})
	if err != nil {
		return res, err
	}
	defer stopSlow()
	for _, a := range []netip.AddrPort{fast, slow} {
		if err := waitReady(ctx, client, a); err != nil {
			return res, err
		}
	}

	res = RateResult{Envelope: bench.NewEnvelope(ctx, RateSchema, Rate, map[string]any{"levels": o.Levels, "n": o.N, "warmup": o.Warmup, "repeats": o.Repeats,
		"hedge_delay_ms": ms(o.Delay), "timeout_ms": ms(o.Timeout), "stall_pct": o.StallPct, "stall_ms": ms(o.Stall),
		"fast_ms": 0, "budget_fast": "ratio 0.05, burst 10000", "budget_chaos": "ratio 0.1, burst 10000", "connected": true, "payload_len": 32})}
	cfg := &hedge.Config{Interface: client.Iface, DelayLine: hedge.DelayLineConfig{Backend: o.Backend},
		Services: []hedge.ServiceConfig{
			// Each clone holds a budget token while it rides the delay line, so a service
			// needs burst >= requests/s x delay for every request to be cloned (docs/hedging.md,
			// Budget); the fast-path cost is measured with every request cloned.
			{Name: "fast", Address: fast.String(), Delay: hedge.DelaySpec{Fixed: o.Delay}, Budget: hedge.BudgetSpec{Ratio: 0.05, Burst: 10000}},
			// The loops' stalls come in synchronised bursts (every loop meets ids ending in
			// 00 and 01 at about the same time): a burst of 10 would refuse most of a burst
			// of stalls at 16 loops and more. The budget is not what this run measures, so it
			// is wide; refusals would still be counted (budget_exhausted).
			{Name: "chaos", Address: slow.String(), Delay: hedge.DelaySpec{Fixed: o.Delay}, Budget: hedge.BudgetSpec{Ratio: 0.1, Burst: 10000}},
		}}

	if res.IdleCPUOff, err = bench.IdleCPU(ctx, time.Second); err != nil {
		return res, err
	}
	next := uint32(0) // run counter: id ranges
	runClient := func(c, rep int, svc string, to netip.AddrPort, h *hedge.Hedger) (RateRun, error) {
		next++
		run := RateRun{Concurrency: c, Repeat: rep, Service: svc, Kedge: h != nil}
		path := filepath.Join(o.OutDir, fmt.Sprintf("c%d-r%d-%s-%s.json", c, rep, svc, map[bool]string{false: "off", true: "on"}[h != nil]))
		var before *hedge.Snapshot
		var err error
		if h != nil {
			if before, err = h.Stats(); err != nil {
				return run, err
			}
		}
		cpu0, err := bench.ReadCPU()
		if err != nil {
			return run, err
		}
		o.Log.Info("rate run", "concurrency", c, "repeat", rep, "service", svc, "kedge", h != nil)
		err = bench.RunProcess(ctx, client, io.Discard, o.Exe, "chaos", "client", "--mode", "baseline", "--connected",
			"--target", to.String(), "-n", fmt.Sprint(o.N), "--warmup", fmt.Sprint(o.Warmup),
			"--concurrency", fmt.Sprint(c), "--timeout", o.Timeout.String(), "--base-id", fmt.Sprint(next*idSpan),
			"--scenario", Rate, "--name", filepath.Base(path), "--out", path)
		cpu1, cerr := bench.ReadCPU()
		if err = errors.Join(err, cerr); err != nil {
			return run, err
		}
		r, err := bench.ReadFile(path)
		if err != nil {
			return run, err
		}
		_ = os.Remove(path) // per-request data of every run would be ~100 MB; result.json keeps the summary
		if len(r.Series) != 1 {
			return run, fmt.Errorf("%s: %d series, want 1", path, len(r.Series))
		}
		s := r.Series[0]
		stallPct := 0
		if svc == "chaos" {
			stallPct = o.StallPct
		}
		summarizeRun(&run, s, cpu1.Sub(cpu0), stallPct, o.Stall)
		if h != nil {
			// Let the last clones leave the delay line before counting.
			time.Sleep(o.Delay + 50*time.Millisecond)
			after, err := h.Stats()
			if err != nil {
				return run, err
			}
			i := slices.IndexFunc(after.Services, func(s hedge.ServiceStats) bool { return s.Name == svc })
			run.Counters = diffCounters(after.Services[i].Counters, before.Services[i].Counters)
			dl := diffCounters(after.DelayLine, before.DelayLine)
			lost := sub0(dl["carried_in"], dl["carried_out"]) + run.Counters["clone_errors"]
			run.LostClones = &lost
		}
		return run, nil
	}

	for _, c := range o.Levels {
		for rep := 1; rep <= o.Repeats; rep++ {
			// Alternate the order so that drift over the run (other work on the machine,
			// caches) does not always favour the same side.
			onFirst := rep%2 == 0
			for _, on := range []bool{onFirst, !onFirst} {
				if !on {
					run, err := runClient(c, rep, "fast", fast, nil)
					if err != nil {
						return res, err
					}
					res.Runs = append(res.Runs, run)
					continue
				}
				h, err := hedge.Start(cfg, hedge.Options{Netns: client.Handle, Backend: o.Backend, Log: o.Log})
				if err != nil {
					return res, fmt.Errorf("start kernel hedger: %w", err)
				}
				res.Backend = h.Backend
				if res.IdleCPUOn == 0 {
					if res.IdleCPUOn, err = bench.IdleCPU(ctx, time.Second); err != nil {
						return res, errors.Join(err, h.Close())
					}
				}
				for _, svc := range []struct {
					name string
					to   netip.AddrPort
				}{{"fast", fast}, {"chaos", slow}} {
					run, err := runClient(c, rep, svc.name, svc.to, h)
					if err != nil {
						return res, errors.Join(err, h.Close())
					}
					res.Runs = append(res.Runs, run)
				}
				if err := h.Close(); err != nil {
					return res, err
				}
			}
		}
	}
	res.Levels = rateLevels(res.Runs, o.Levels)
	if err := bench.WriteJSON(filepath.Join(o.OutDir, "result.json"), res); err != nil {
		return res, err
	}
	return res, writeRateCharts(o.OutDir, res)
}

func sub0(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

func diffCounters(after, before map[string]uint64) map[string]uint64 {
	out := make(map[string]uint64, len(after))
	for k, v := range after {
		out[k] = sub0(v, before[k])
	}
	return out
}

// summarizeRun fills run's latency, CPU and stall figures from series s.
func summarizeRun(run *RateRun, s bench.Series, cpu bench.CPUTimes, stallPct int, stall time.Duration) {
	run.Requests, run.ElapsedS = s.Requests(), s.ElapsedS
	if s.ElapsedS > 0 {
		run.RPS = float64(s.Requests()) / s.ElapsedS
	}
	run.Timeouts, run.LateDuplicates = s.Timeouts, s.LateDuplicates
	var fastLat, rescue []float64
	for i, id := range s.IDs {
		if stallPct > 0 && chaos.Stalls(0, id, stallPct) {
			run.Stalled++
			// Answered before the stall ended: a hedge did it (the original is held for
			// the whole stall).
			if s.OK[i] && s.LatenciesUS[i] < float64(stall.Microseconds()) {
				run.Rescued++
				rescue = append(rescue, s.LatenciesUS[i])
			}
			continue
		}
		fastLat = append(fastLat, s.LatenciesUS[i])
	}
	slices.Sort(fastLat)
	run.P50US, run.P99US = pct(fastLat, 50), pct(fastLat, 99)
	run.P999US, run.MaxUS = pct(fastLat, 99.9), pct(fastLat, 100)
	if stallPct > 0 {
		missed := run.Stalled - run.Rescued
		run.Missed = &missed
		slices.Sort(rescue)
		run.RescueP50US, run.RescueMaxUS = pct(rescue, 50), pct(rescue, 100)
	}
	if secs := cpu.Wall.Seconds(); secs > 0 {
		run.CPUBusy, run.CPUSoftirq = cpu.BusyCPUs(), cpu.Softirq.Seconds()/secs
	}
	if run.Requests > 0 {
		run.CPUPerReqUS = float64(cpu.Busy.Microseconds()) / float64(run.Requests)
	}
}

// rateLevels summarises the runs per level: medians over the repeats, and the median of
// the paired differences.
func rateLevels(runs []RateRun, levels []int) []RateLevel {
	out := make([]RateLevel, 0, len(levels))
	for _, c := range levels {
		lv := RateLevel{Concurrency: c}
		var offRPS, onRPS, offP50, onP50, offP99, onP99, dP50, dP99, offCPU, onCPU, chaosRPS []float64
		byRep := map[int][2]*RateRun{}
		for i := range runs {
			r := &runs[i]
			if r.Concurrency != c {
				continue
			}
			switch {
			case r.Service == "chaos":
				chaosRPS = append(chaosRPS, r.RPS)
				lv.Stalled += r.Stalled
				lv.BudgetExhausted += r.Counters["budget_exhausted"]
				if r.Missed != nil {
					lv.Missed += *r.Missed
				}
				if r.LostClones != nil {
					lv.LostClones += *r.LostClones
				}
				lv.Timeouts += r.Timeouts
			case r.Kedge:
				onRPS, onP50, onP99, onCPU = append(onRPS, r.RPS), append(onP50, r.P50US), append(onP99, r.P99US), append(onCPU, r.CPUPerReqUS)
				p := byRep[r.Repeat]
				p[1] = r
				byRep[r.Repeat] = p
				if r.LostClones != nil {
					lv.LostClones += *r.LostClones
				}
				lv.Timeouts += r.Timeouts
			default:
				offRPS, offP50, offP99, offCPU = append(offRPS, r.RPS), append(offP50, r.P50US), append(offP99, r.P99US), append(offCPU, r.CPUPerReqUS)
				p := byRep[r.Repeat]
				p[0] = r
				byRep[r.Repeat] = p
			}
		}
		for _, p := range byRep {
			if p[0] != nil && p[1] != nil {
				dP50 = append(dP50, p[1].P50US-p[0].P50US)
				dP99 = append(dP99, p[1].P99US-p[0].P99US)
			}
		}
		lv.OffRPS, lv.OnRPS, lv.ChaosRPS = median(offRPS), median(onRPS), median(chaosRPS)
		lv.OffP50US, lv.OnP50US, lv.OffP99US, lv.OnP99US = median(offP50), median(onP50), median(offP99), median(onP99)
		lv.DeltaP50US, lv.DeltaP99US = median(dP50), median(dP99)
		lv.OffCPUPerReqUS, lv.OnCPUPerReqUS = median(offCPU), median(onCPU)
		out = append(out, lv)
	}
	return out
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return pct(s, 50)
}

// pct is bench.Percentile with 0 for no values (JSON has no NaN).
func pct(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return bench.Percentile(sorted, p)
}
