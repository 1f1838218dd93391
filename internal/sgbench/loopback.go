package sgbench

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"gonum.org/v1/plot/plotter"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/sgbench/floor"
)

// LoopSchema is the schema of the loopback scenario's result.json.
const LoopSchema = "kedge.bench.sg-loopback/v1"

// LoopOptions configure `kedge bench sg --scenario loopback`: the setup in which kedge was
// measured against sgbpf: one private namespace's loopback, one
// `kedge sg worker` process with a socket per worker pinned to CPU 0, the coordinator (the
// client process) pinned to CPU 1, replies of 256 x int32, 1 and 32 requests outstanding.
type LoopOptions struct {
	Kedge string // the kedge binary (the "kedge" client and the workers of every method but kedge-before)
	// Before, if set, is another kedge binary whose client and workers run as method
	// "kedge-before", alternating with "kedge" in every round: the before/after ratio of
	// one sitting.
	Before      string
	Methods     []string // "kedge", "kedge-before", and any of LoopMethods
	Fanouts     []int
	Outstanding []int
	Rounds      int
	Elems       int
	Type        string
	Duration    time.Duration // the measured window of each run
	Warmup      int           // requests before the window, one at a time
	Timeout     time.Duration
	// StealRetries: a point (fan-out, outstanding) of a round any of whose runs had more
	// than StealFlagCPUs of hypervisor steal is run again, every method, up to this many
	// times; the runs set aside stay in the result (LoopResult.Discarded).
	StealRetries int
	Out          string
}

// The loopback scenario's floor (internal/sgbench/floor): the cheapest in-kernel
// scatter-gather that moves the same packets, with kedge's client structure and ring
// reader (floor-nopoll: the reader of kedge-nopoll, PollSpin off); it reduces and checks
// nothing, so it bounds any implementation from below.
const (
	FloorMethod       = "floor"
	FloorNoPollMethod = "floor-nopoll"
)

// IsFloor tells the floor's methods.
func IsFloor(method string) bool { return method == FloorMethod || method == FloorNoPollMethod }

// LoopMethods are the methods the loopback scenario takes besides kedge-before.
var LoopMethods = append(slices.Clone(AllMethods), FloorMethod, FloorNoPollMethod)

// floorClient is the floor's client: one floor.Floor, its requesters waiting on it as
// kedge's wait on their group. Workers must be on consecutive ports.
func floorClient(o ClientOptions) (*client, error) {
	for i, w := range o.Workers {
		if w.Addr() != o.Workers[0].Addr() || int(w.Port()) != int(o.Workers[0].Port())+i {
			return nil, fmt.Errorf("floor: worker %d is %v, want consecutive ports from %v", i, w, o.Workers[0])
		}
	}
	cfg := floor.Config{Interface: o.Interface, Worker0: o.Workers[0], Fanout: len(o.Workers), InFlight: max(o.Outstanding, 1), Timeout: o.Timeout}
	if o.Method == FloorNoPollMethod {
		cfg.PollSpin = -1
	}
	f, err := floor.Open(cfg)
	if err != nil {
		return nil, err
	}
	return &client{newReq: func() (requester, error) { return floorReq{f}, nil }, cleanup: func() { f.Close() }, unchecked: true}, nil
}

type floorReq struct{ f *floor.Floor }

func (r floorReq) do(uint64) (int64, uint64, bool, error) {
	id, ok, err := r.f.Do(context.Background())
	return 0, id, ok, err
}

func (floorReq) close() {}

// DefaultLoopOptions: the table (fan-outs 4, 16, 64; 1 and 32 outstanding; 3
// rounds; 2 s windows; 256 x int32).
func DefaultLoopOptions() LoopOptions {
	return LoopOptions{Methods: []string{"kedge"}, Fanouts: []int{4, 16, 64}, Outstanding: []int{1, 32}, Rounds: 3,
		Elems: 256, Type: "int32", Duration: 2 * time.Second, Warmup: 300, Timeout: 200 * time.Millisecond,
		StealRetries: 2, Out: "results/sg-loopback"}
}

// LoopRow is one run: one method at one fan-out and outstanding count, in one round.
type LoopRow struct {
	Round       int     `json:"round"`
	Method      string  `json:"method"`
	Fanout      int     `json:"fanout"`
	Outstanding int     `json:"outstanding"`
	ReqPerSec   float64 `json:"req_per_s"`
	// CPUUSPerReq is the busy time of both CPUs over the window / requests completed in it.
	CPUUSPerReq  float64    `json:"cpu_us_per_req"`
	CPUBusy      [2]float64 `json:"cpu_busy"` // CPU 0 (workers), CPU 1 (coordinator)
	CPUSoftirq   [2]float64 `json:"cpu_softirq"`
	ClientCPUUS  float64    `json:"client_cpu_us_per_req"`
	WorkerCPUUS  float64    `json:"worker_cpu_us_per_req"`
	P50US        float64    `json:"p50_us"` // latencies of the window's requests
	P99US        float64    `json:"p99_us"`
	Completed    int64      `json:"completed"`
	Timeouts     int64      `json:"timeouts"`
	Mismatches   int64      `json:"mismatches"`
	WindowSecond float64    `json:"window_s"`
	// StealCPUs is the CPU time the hypervisor took from the VM over the window, in CPUs
	// (/proc/stat's steal / wall; part of CPUBusy): above StealFlagCPUs the run is flagged.
	StealCPUs float64 `json:"steal_cpus"`
}

// Reference is one row of the table kedge and sgbpf were measured in (the issue that set the
// fast path's targets: sgbpf's own benchmark against kedge, alternating, 3 rounds, this
// setup). CPU and p50 are the ranges over the rounds; zero: not measured.
type Reference struct {
	Fanout      int        `json:"fanout"`
	Outstanding int        `json:"outstanding"`
	KedgeRPS    float64    `json:"kedge_req_per_s"`
	SgbpfRPS    float64    `json:"sgbpf_req_per_s"`
	KedgeCPUUS  [2]float64 `json:"kedge_cpu_us_per_req"`
	SgbpfCPUUS  [2]float64 `json:"sgbpf_cpu_us_per_req"`
	KedgeP50US  [2]float64 `json:"kedge_p50_us"`
	SgbpfP50US  [2]float64 `json:"sgbpf_p50_us"`
	TargetRPS   float64    `json:"target_rps_ratio"` // kedge / sgbpf at least
	TargetCPU   float64    `json:"target_cpu_ratio"` // kedge / sgbpf at most
	Description string     `json:"description,omitempty"`
}

// References is that table. sgbpf's code is not in kedge, so the targets are checked
// through kedge's own figures: a run of the kedge that was measured then ("kedge-before")
// beside the current one calibrates this machine against that one.
var References = []Reference{
	{Fanout: 4, Outstanding: 1, KedgeRPS: 10652, SgbpfRPS: 14025, KedgeCPUUS: [2]float64{66, 76}, SgbpfCPUUS: [2]float64{47, 52}, KedgeP50US: [2]float64{84, 86}, SgbpfP50US: [2]float64{66, 71}},
	{Fanout: 16, Outstanding: 1, KedgeRPS: 6338, SgbpfRPS: 6177, KedgeCPUUS: [2]float64{134, 155}, SgbpfCPUUS: [2]float64{139, 142}, KedgeP50US: [2]float64{141, 145}, SgbpfP50US: [2]float64{149, 151}},
	{Fanout: 64, Outstanding: 1, KedgeRPS: 2820, SgbpfRPS: 1623, KedgeCPUUS: [2]float64{378, 400}, SgbpfCPUUS: [2]float64{740, 803}, KedgeP50US: [2]float64{327, 335}, SgbpfP50US: [2]float64{576, 616}},
	{Fanout: 4, Outstanding: 32, KedgeRPS: 63570, SgbpfRPS: 80255, KedgeCPUUS: [2]float64{26, 27}, SgbpfCPUUS: [2]float64{20, 21}},
	{Fanout: 16, Outstanding: 32, KedgeRPS: 17770, SgbpfRPS: 21835, KedgeCPUUS: [2]float64{83, 86}, SgbpfCPUUS: [2]float64{72, 73}},
	{Fanout: 64, Outstanding: 32, KedgeRPS: 5019, SgbpfRPS: 5279, KedgeCPUUS: [2]float64{263, 302}, SgbpfCPUUS: [2]float64{287, 297}},
}

// The fast path's targets against sgbpf (each fan-out, 1 and 32 outstanding).
const (
	TargetRPSRatio = 1.25
	TargetCPURatio = 0.8
)

func reference(f, o int) (Reference, bool) {
	for _, r := range References {
		if r.Fanout == f && r.Outstanding == o {
			r.TargetRPS, r.TargetCPU = TargetRPSRatio, TargetCPURatio
			return r, true
		}
	}
	return Reference{}, false
}

func mid(r [2]float64) float64 { return (r[0] + r[1]) / 2 }

// LoopSummary is one method at one (fan-out, outstanding): the median over the rounds, and
// against sgbpf: raw (this machine's figure over the reference's) and, with kedge-before in
// the run, calibrated (this machine's after/before ratio times the reference's kedge/sgbpf).
type LoopSummary struct {
	Method      string  `json:"method"`
	Fanout      int     `json:"fanout"`
	Outstanding int     `json:"outstanding"`
	Rounds      int     `json:"rounds"`
	ReqPerSec   float64 `json:"req_per_s"` // median over the rounds
	ReqPerSecLo float64 `json:"req_per_s_min"`
	ReqPerSecHi float64 `json:"req_per_s_max"`
	CPUUSPerReq float64 `json:"cpu_us_per_req"`
	CPULo       float64 `json:"cpu_us_per_req_min"`
	CPUHi       float64 `json:"cpu_us_per_req_max"`
	P50US       float64 `json:"p50_us"`
	// Against the reference's kedge measured then, rounds paired: this method over
	// kedge-before, median of the rounds' ratios (0: no kedge-before in the run).
	VsBeforeRPS float64 `json:"vs_before_rps"`
	VsBeforeCPU float64 `json:"vs_before_cpu"`
	// The same over the rounds in which neither arm's run had more than StealFlagCPUs of
	// hypervisor steal (SteadyRounds of them; 0: none, and the ratios are not set).
	SteadyRounds      int     `json:"steady_rounds"`
	SteadyVsBeforeRPS float64 `json:"steady_vs_before_rps,omitempty"`
	SteadyVsBeforeCPU float64 `json:"steady_vs_before_cpu,omitempty"`
	// Against sgbpf (the reference): raw, this machine's figure over sgbpf's; calibrated,
	// VsBefore x (reference kedge / reference sgbpf).
	RawRPS        float64 `json:"sgbpf_rps_ratio_raw"`
	RawCPU        float64 `json:"sgbpf_cpu_ratio_raw"`
	CalibratedRPS float64 `json:"sgbpf_rps_ratio"`
	CalibratedCPU float64 `json:"sgbpf_cpu_ratio"`
	Met           *bool   `json:"targets_met,omitempty"` // calibrated ratios within the targets
}

// LoopResult is the loopback scenario's result.json.
type LoopResult struct {
	bench.Envelope
	Placement  string        `json:"placement"`
	Rows       []LoopRow     `json:"rows"`
	Summary    []LoopSummary `json:"summary"`
	References []Reference   `json:"references"`
	// Discarded are the runs set aside for steal and run again (StealRetries); the summary
	// is of Rows alone.
	Discarded []LoopRow `json:"discarded,omitempty"`
}

// RunLoopback runs the scenario: one namespace, the workers started once (max fan-out
// sockets), then for each round every (fan-out, outstanding) with every method, the
// methods' order reversed on every other round.
func RunLoopback(ctx context.Context, o LoopOptions, log io.Writer) (*LoopResult, error) {
	maxF := slices.Max(o.Fanouts)
	res := &LoopResult{Envelope: bench.NewEnvelope(ctx, LoopSchema, "loopback", map[string]any{
		"fanouts": o.Fanouts, "outstanding": o.Outstanding, "methods": o.Methods, "rounds": o.Rounds,
		"elems": o.Elems, "type": o.Type, "window_s": o.Duration.Seconds(), "warmup": o.Warmup,
		"timeout_ms": o.Timeout.Milliseconds(), "before": o.Before != "", "steal_retries": o.StealRetries}),
		Placement: "one private network namespace's loopback; all workers in one `kedge sg worker` process " +
			"(one epoll thread, recvmmsg/sendmmsg, a UDP socket per worker) pinned to CPU 0; the coordinator " +
			"(client process) pinned to CPU 1; CPU per request = busy time of both CPUs over the window / requests"}
	for _, f := range o.Fanouts {
		for _, n := range o.Outstanding {
			if r, ok := reference(f, n); ok {
				res.References = append(res.References, r)
			}
		}
	}
	ns, err := netnsx.New(netnsx.OwnedName("sgloop"))
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	if err := ns.LoopbackUp(); err != nil {
		return nil, err
	}
	// Each build answers with its own `kedge sg worker` (kedge-before: the old binary's,
	// on the next ports), so an arm is the whole of that build, workers included, as in the
	// table the targets come from. Both worker processes are pinned to CPU 0; the one of
	// the arm not running waits in epoll_wait.
	const port = 20000
	type workers struct{ pid, port int }
	arms := map[string]workers{}
	for _, a := range []struct{ method, bin string }{{"kedge", o.Kedge}, {"kedge-before", o.Before}} {
		if a.method == "kedge-before" && !slices.Contains(o.Methods, a.method) {
			continue // the kedge workers answer every other method (baselines too)
		}
		p := port + len(arms)*maxF
		wpid, stop, err := startWorkers(a.bin, "0", ns.Path(), "--listen", fmt.Sprintf("127.0.0.1:%d+%d", p, maxF),
			"--type", o.Type, "--elems", strconv.Itoa(o.Elems), "--threads", "1")
		if err != nil {
			return nil, fmt.Errorf("%s: %w", a.method, err)
		}
		defer stop()
		arms[a.method] = workers{wpid, p}
	}
	for round := range o.Rounds {
		methods := slices.Clone(o.Methods)
		if round%2 == 1 {
			slices.Reverse(methods)
		}
		for _, f := range o.Fanouts {
			for _, n := range o.Outstanding {
				kept, discarded, err := runPoint(methods, o.StealRetries, log, func(m string) (LoopRow, error) {
					bin, method, ws := o.Kedge, m, arms["kedge"]
					if m == "kedge-before" {
						bin, method, ws = o.Before, "kedge", arms["kedge-before"]
					}
					w, err := runClientProc(ctx, clientProc{bin: bin, cpu: "1", netns: ns.Path(), iface: "lo", method: method,
						workers: fmt.Sprintf("127.0.0.1:%d+%d", ws.port, f), typ: o.Type, elems: o.Elems, lat: o.Warmup,
						outstanding: n, duration: o.Duration, timeout: o.Timeout, workerPID: ws.pid})
					if err != nil {
						return LoopRow{}, fmt.Errorf("round %d, fan-out %d, %d outstanding, %s: %w", round+1, f, n, m, err)
					}
					row := loopRow(w, round+1, m, f, n)
					fmt.Fprintf(log, "round %d fan-out %3d outstanding %2d %-13s %9.0f req/s  CPU %7.1f us/req (CPU0/1 busy %.2f/%.2f)  p50 %7.1f us  p99 %7.1f us  timeouts %d  mismatches %d  %s\n",
						row.Round, f, n, m, row.ReqPerSec, row.CPUUSPerReq, row.CPUBusy[0], row.CPUBusy[1], row.P50US, row.P99US, row.Timeouts, row.Mismatches,
						stealMark(row.StealCPUs))
					return row, nil
				})
				if err != nil {
					return nil, err
				}
				res.Rows, res.Discarded = append(res.Rows, kept...), append(res.Discarded, discarded...)
			}
		}
	}
	res.Summary = summarize(res.Rows, o)
	return res, nil
}

// runPoint runs every method of one point of a round (run), and runs them all again while
// one of them had more than StealFlagCPUs of steal and retries are left: the methods of a
// point stay paired within one try. It returns the last try's rows and those set aside.
func runPoint(methods []string, retries int, log io.Writer, run func(m string) (LoopRow, error)) (kept, discarded []LoopRow, err error) {
	for try := 0; ; try++ {
		var rows []LoopRow
		stolen := false
		for _, m := range methods {
			row, err := run(m)
			if err != nil {
				return nil, nil, err
			}
			rows = append(rows, row)
			stolen = stolen || row.StealCPUs > StealFlagCPUs
		}
		if !stolen || try >= retries {
			return rows, discarded, nil
		}
		fmt.Fprintf(log, "steal over %.2f CPUs: this point runs again (%d of %d)\n", StealFlagCPUs, try+1, retries)
		discarded = append(discarded, rows...)
	}
}

func loopRow(w *clientWindow, round int, m string, f, n int) LoopRow {
	cr := &w.cr
	row := LoopRow{Round: round, Method: m, Fanout: f, Outstanding: n, Completed: cr.Completed, Timeouts: cr.Timeouts,
		Mismatches: cr.Mismatches, CPUBusy: w.busy, CPUSoftirq: w.softirq, P50US: cr.LoadedP50US, P99US: cr.LoadedP99US,
		WindowSecond: w.wall.Seconds(), StealCPUs: w.steal}
	if w.wall > 0 {
		row.ReqPerSec = float64(cr.Completed) / w.wall.Seconds()
	}
	if cr.Completed > 0 {
		row.CPUUSPerReq = w.machine.Seconds() * 1e6 / float64(cr.Completed)
		row.ClientCPUUS = (cr.CPUUserSec + cr.CPUSysSec) * 1e6 / float64(cr.Completed)
		row.WorkerCPUUS = w.worker.Seconds() * 1e6 / float64(cr.Completed)
	}
	return row
}

// summarize computes the medians and the ratios per (method, fan-out, outstanding).
func summarize(rows []LoopRow, o LoopOptions) []LoopSummary {
	var out []LoopSummary
	for _, f := range o.Fanouts {
		for _, n := range o.Outstanding {
			pick := func(m string) []LoopRow {
				var rs []LoopRow
				for _, r := range rows {
					if r.Method == m && r.Fanout == f && r.Outstanding == n {
						rs = append(rs, r)
					}
				}
				return rs
			}
			before := pick("kedge-before")
			ref, hasRef := reference(f, n)
			for _, m := range o.Methods {
				rs := pick(m)
				if len(rs) == 0 {
					continue
				}
				s := LoopSummary{Method: m, Fanout: f, Outstanding: n, Rounds: len(rs)}
				rps := collect(rs, func(r LoopRow) float64 { return r.ReqPerSec })
				cpu := collect(rs, func(r LoopRow) float64 { return r.CPUUSPerReq })
				s.ReqPerSec, s.ReqPerSecLo, s.ReqPerSecHi = bench.Median(rps), slices.Min(rps), slices.Max(rps)
				s.CPUUSPerReq, s.CPULo, s.CPUHi = bench.Median(cpu), slices.Min(cpu), slices.Max(cpu)
				s.P50US = bench.Median(collect(rs, func(r LoopRow) float64 { return r.P50US }))
				if len(before) == len(rs) && m != "kedge-before" {
					var rr, cr, srr, scr []float64
					for i := range rs {
						if before[i].ReqPerSec > 0 && before[i].CPUUSPerReq > 0 {
							r, c := rs[i].ReqPerSec/before[i].ReqPerSec, rs[i].CPUUSPerReq/before[i].CPUUSPerReq
							rr, cr = append(rr, r), append(cr, c)
							if rs[i].StealCPUs <= StealFlagCPUs && before[i].StealCPUs <= StealFlagCPUs {
								srr, scr = append(srr, r), append(scr, c)
							}
						}
					}
					if len(rr) > 0 {
						s.VsBeforeRPS, s.VsBeforeCPU = bench.Median(rr), bench.Median(cr)
					}
					if s.SteadyRounds = len(srr); len(srr) > 0 {
						s.SteadyVsBeforeRPS, s.SteadyVsBeforeCPU = bench.Median(srr), bench.Median(scr)
					}
				}
				if hasRef {
					s.RawRPS = s.ReqPerSec / ref.SgbpfRPS
					s.RawCPU = s.CPUUSPerReq / mid(ref.SgbpfCPUUS)
					if s.VsBeforeRPS > 0 {
						s.CalibratedRPS = s.VsBeforeRPS * ref.KedgeRPS / ref.SgbpfRPS
						s.CalibratedCPU = s.VsBeforeCPU * mid(ref.KedgeCPUUS) / mid(ref.SgbpfCPUUS)
						met := s.CalibratedRPS >= ref.TargetRPS && s.CalibratedCPU <= ref.TargetCPU
						s.Met = &met
					}
				}
				out = append(out, s)
			}
		}
	}
	return out
}

func collect(rs []LoopRow, f func(LoopRow) float64) []float64 {
	out := make([]float64, len(rs))
	for i, r := range rs {
		out[i] = f(r)
	}
	return out
}

// WriteLoopTable prints the summary.
func WriteLoopTable(w io.Writer, r *LoopResult) {
	fmt.Fprintf(w, "%-7s %-4s %-13s %10s %14s %8s %10s %10s %12s %12s %-7s %s\n", "FANOUT", "OUT", "METHOD", "REQ/S", "CPU_US/REQ",
		"P50_US", "VS_BEFORE", "CPU_VS_B", "SGBPF_REQ/S", "SGBPF_CPU", "TARGETS", "VS_BEFORE_WITHOUT_STEAL (ROUNDS)")
	for _, s := range r.Summary {
		met, steady := "-", "-"
		if s.Met != nil {
			met = map[bool]string{true: "met", false: "missed"}[*s.Met]
		}
		if s.SteadyRounds > 0 {
			steady = fmt.Sprintf("%.2fx, CPU %.2fx (%d)", s.SteadyVsBeforeRPS, s.SteadyVsBeforeCPU, s.SteadyRounds)
		}
		fmt.Fprintf(w, "%-7d %-4d %-13s %10.0f %14.1f %8.1f %9.2fx %9.2fx %11.2fx %11.2fx %-7s %s\n", s.Fanout, s.Outstanding, s.Method,
			s.ReqPerSec, s.CPUUSPerReq, s.P50US, s.VsBeforeRPS, s.VsBeforeCPU, s.CalibratedRPS, s.CalibratedCPU, met, steady)
	}
	if len(r.Discarded) > 0 {
		fmt.Fprintf(w, "%d runs set aside for steal over %.2f CPUs and run again (result.json: discarded)\n", len(r.Discarded), StealFlagCPUs)
	}
	writeStealRuns(w, r.stealRuns())
}

// stealRuns names every run with its steal.
func (r *LoopResult) stealRuns() []stealRun {
	out := make([]stealRun, len(r.Rows))
	for i, x := range r.Rows {
		out[i] = stealRun{fmt.Sprintf("round %d fan-out %d outstanding %d %s", x.Round, x.Fanout, x.Outstanding, x.Method), x.StealCPUs}
	}
	return out
}

// WriteLoopMarkdown renders r for docs/benchmarks.md: the envelope, the summary against
// sgbpf, and every run.
func WriteLoopMarkdown(w io.Writer, r *LoopResult) {
	fmt.Fprintf(w, "Run: %s.\n\n", r.Envelope.Describe())
	fmt.Fprintf(w, "Placement: %s.\n\n", r.Placement)
	fmt.Fprintln(w, "| fan-out | outstanding | method | req/s (median, range) | CPU us/req (median, range) | p50 us | vs kedge-before: req/s, CPU | vs sgbpf (calibrated): req/s >= 1.25x, CPU <= 0.8x | raw vs sgbpf's figures |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	for _, s := range r.Summary {
		vs, sg := "-", "-"
		if s.VsBeforeRPS > 0 {
			vs = fmt.Sprintf("%.2fx, %.2fx", s.VsBeforeRPS, s.VsBeforeCPU)
		}
		if s.Met != nil {
			sg = fmt.Sprintf("%.2fx, %.2fx (%s)", s.CalibratedRPS, s.CalibratedCPU, map[bool]string{true: "met", false: "missed"}[*s.Met])
		}
		fmt.Fprintf(w, "| %d | %d | %s | %.0f (%.0f-%.0f) | %.1f (%.1f-%.1f) | %.0f | %s | %s | %.2fx, %.2fx |\n", s.Fanout, s.Outstanding, s.Method,
			s.ReqPerSec, s.ReqPerSecLo, s.ReqPerSecHi, s.CPUUSPerReq, s.CPULo, s.CPUHi, s.P50US, vs, sg, s.RawRPS, s.RawCPU)
	}
}

// WriteLoopCharts writes, per measure (requests/s, CPU per request), each method's median
// against fan-out, one line per method and outstanding count (loopback-rps, loopback-cpu;
// PNG and SVG).
func WriteLoopCharts(dir string, r *LoopResult) error {
	for _, c := range []struct {
		name, title, y string
		val            func(LoopSummary) float64
	}{{"loopback-rps", "requests/s", "requests/s (median of the rounds, log)", func(s LoopSummary) float64 { return s.ReqPerSec }},
		{"loopback-cpu", "CPU per request", "CPU us per request, both CPUs (median, log)", func(s LoopSummary) float64 { return s.CPUUSPerReq }}} {
		type line struct {
			method string
			out    int
		}
		var lines []line
		for _, s := range r.Summary {
			if l := (line{s.Method, s.Outstanding}); !slices.Contains(lines, l) {
				lines = append(lines, l)
			}
		}
		var args []any
		for _, l := range lines {
			var pts plotter.XYs
			for _, s := range r.Summary {
				if s.Method == l.method && s.Outstanding == l.out && c.val(s) > 0 {
					pts = append(pts, plotter.XY{X: float64(s.Fanout), Y: c.val(s)})
				}
			}
			args = append(args, fmt.Sprintf("%s, %d outstanding", l.method, l.out), pts)
		}
		title := "kedge bench sg --scenario loopback: " + c.title + " against fan-out"
		if err := saveFanoutChart(filepath.Join(dir, c.name), title, "fan-out (log)", c.y, args); err != nil {
			return err
		}
	}
	return nil
}
