package sgbench

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/pkg/sg"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// The tail scenario (`kedge bench sg --scenario tail`): "The Tail at Scale"'s fan-out. Every
// shard has two replicas, `kedge sg worker` processes on two lab hosts, each of whose
// replies is late by 20-50 ms with probability 1% (a straggler); methods side by side,
// rounds alternating: kedge without re-sends, kedge hedging in the kernel, and the
// user-space baseline with the same hedging logic (hedgereq.go), against kedge on
// straggler-free workers (the reference). A second mode loses 1% of the request copies
// at the worker instead (no replicas: kedge retries to the same worker).

// TailSchema is the tail scenario's result.json.
const TailSchema = "kedge.bench.sg-tail/v1"

// Client methods of the tail scenario (kedge bench sg-client --method): pkg/sg with
// replicas and re-sends as the client's flags say, and the user-space re-send baseline.
const (
	tailKedge = "tail-kedge"
	tailUser  = "tail-user"
)

// TailMethods are the tail scenario's client methods.
var TailMethods = []string{tailKedge, tailUser}

// IsTailKedge: the tail scenario's kedge client.
func IsTailKedge(m string) bool { return m == tailKedge }

// IsTailUser: the tail scenario's user-space client.
func IsTailUser(m string) bool { return m == tailUser }

// tailConfig puts the tail scenario's replicas and re-send settings into a group's config.
func (o ClientOptions) tailConfig(cfg *sg.Config) {
	for _, r := range o.Replicas {
		cfg.Replicas = append(cfg.Replicas, []netip.AddrPort{r})
	}
	if o.Resend > 0 {
		cfg.Resend, cfg.MaxResends, cfg.ResendQuantile, cfg.ResendMin = o.Resend, o.MaxResends, o.ResendQuantile, o.ResendMin
		cfg.ResendBudget = sg.ResendBudget{Ratio: o.ResendRatio, Burst: o.ResendBurst}
	}
}

// Modes of the tail scenario.
const (
	ModeStraggle = "straggle"
	ModeLoss     = "loss"
)

// TailOptions of a run.
type TailOptions struct {
	Kedge       string
	Fanouts     []int
	Modes       []string // straggle, loss
	Rounds      int
	Duration    time.Duration // per method, fan-out and round
	Outstanding int
	Warmup      int // requests one at a time before each measured phase (not measured)
	Elems       int
	// Timeout of a request (straggle mode; loss mode: LossTimeout).
	Timeout     time.Duration
	LossTimeout time.Duration
	// The workers: each reply late by StraggleMin..StraggleMax with probability Straggle
	// (straggle mode), each request copy dropped with probability Loss (loss mode); seeded.
	Straggle    float64
	StraggleMin time.Duration
	StraggleMax time.Duration
	Loss        float64
	Seed        uint64
	// Re-sends, the same for kedge and the user-space baseline: the delay is the group's
	// ResendQuantile of reply times clamped to [ResendMin, Resend] (ResendQuantile 0: Resend);
	// MaxHedges rounds in straggle mode, MaxRetries in loss mode; the budget Ratio x copies
	// + Burst (0: sg.DefaultResendBurst(fan-out), 8 x fan-out). The quantile is HedgeQuantile in
	// straggle mode (hedges to the other replica), ResendQuantile in loss mode (retries to
	// the same worker). Both lie below the stragglers' 1%: at 0.99 every delay between the
	// normal replies' slowest and the straggler delay is a 0.99 quantile, and the estimate
	// wanders between them (docs/sg.md, "Re-sends"). Hedges go earlier, at 0.95: about 5%
	// of the copies hedged where the budget allows 10%, and at fan-out 64 a straggling
	// request ends that much sooner (docs/sg.md, "Tail benchmark").
	Resend         time.Duration
	ResendQuantile float64
	HedgeQuantile  float64
	ResendMin      time.Duration
	MaxHedges      int
	MaxRetries     int
	BudgetRatio    float64
	BudgetBurst    int
	WorkerCPUs     string
	Out            string
	// Before: another kedge binary whose client runs as kedge-hedged-before (straggle) and
	// kedge-retry-before (loss), alternating with the others against the same workers.
	Before string
}

// DefaultTailOptions: fan-outs 16, 64, 256, both modes, 3 rounds of 2 s per method.
func DefaultTailOptions() TailOptions {
	return TailOptions{Fanouts: []int{16, 64, 256}, Modes: []string{ModeStraggle, ModeLoss}, Rounds: 3, Duration: 2 * time.Second,
		Outstanding: 1, Warmup: 50, Elems: 4, Timeout: 200 * time.Millisecond, LossTimeout: 100 * time.Millisecond,
		Straggle: 0.01, StraggleMin: 20 * time.Millisecond, StraggleMax: 50 * time.Millisecond, Loss: 0.01, Seed: 1,
		Resend: 10 * time.Millisecond, ResendQuantile: 0.98, HedgeQuantile: 0.95, ResendMin: 200 * time.Microsecond, MaxHedges: 2, MaxRetries: 4,
		BudgetRatio: 0.1, WorkerCPUs: "1", Out: "results/sg-tail"}
}

// tailMethod is one method of a mode: which client, on which workers, re-sending or not,
// from the Before binary or not.
type tailMethod struct {
	name, client string
	workers      string // the worker set: straggle, clean or loss
	resend       bool
	before       bool
}

func tailMethods(mode string, before bool) []tailMethod {
	var ms []tailMethod
	if mode == ModeLoss {
		ms = []tailMethod{{"kedge", tailKedge, "loss", false, false}, {"kedge-retry", tailKedge, "loss", true, false},
			{"user-retry", tailUser, "loss", true, false}}
	} else {
		ms = []tailMethod{{"kedge-clean", tailKedge, "clean", false, false}, {"kedge", tailKedge, "straggle", false, false},
			{"kedge-hedged", tailKedge, "straggle", true, false}, {"user-hedged", tailUser, "straggle", true, false}}
	}
	if before {
		m := ms[len(ms)-2] // kedge-retry, kedge-hedged
		m.name, m.before = m.name+"-before", true
		ms = append(ms, m)
	}
	return ms
}

// TailRow is one (mode, round, fan-out, method) run. Latencies count a request that timed
// out at the timeout.
type TailRow struct {
	Mode         string  `json:"mode"`
	Round        int     `json:"round"`
	Fanout       int     `json:"fanout"`
	Method       string  `json:"method"`
	Requests     int64   `json:"requests"` // completed and timed out
	Timeouts     int64   `json:"timeouts"`
	P50US        float64 `json:"p50_us"`
	P99US        float64 `json:"p99_us"`
	P999US       float64 `json:"p999_us"`
	MaxUS        float64 `json:"max_us"`
	Throughput   float64 `json:"throughput_rps"`
	ClientCPUUS  float64 `json:"client_cpu_us_per_req"`
	MachineCPUUS float64 `json:"machine_cpu_us_per_req"`
	Mismatches   int64   `json:"mismatches"`
	StealCPUs    float64 `json:"steal_cpus"` // CPUs the hypervisor took over the window (LoopRow.StealCPUs)
	ResendCounts
	// ExtraLoad is copies re-sent / copies scattered; Budget is what the budget allows in
	// the same terms ((ratio x copies + burst) / copies).
	ExtraLoad float64 `json:"extra_load"`
	Budget    float64 `json:"budget"`
	// The re-send delay as sampled over the loaded phase (every DelaySample).
	Delay     *DelayQuantiles `json:"delay,omitempty"`
	latencies []float64
}

// meanLateUS is how late a round came after its due time on average (us).
func meanLateUS(c ResendCounts) float64 {
	if c.Rounds == 0 {
		return 0
	}
	return float64(c.LateNs) / float64(c.Rounds) / 1e3
}

func (d *DelayQuantiles) String() string {
	if d == nil {
		return "delay not sampled"
	}
	return fmt.Sprintf("delay p10 %.0f p50 %.0f p90 %.0f max %.0f us", d.P10US, d.P50US, d.P90US, d.MaxUS)
}

// TailSummary pools a (mode, fan-out, method)'s rounds.
type TailSummary struct {
	Mode       string    `json:"mode"`
	Fanout     int       `json:"fanout"`
	Method     string    `json:"method"`
	Requests   int64     `json:"requests"`
	Timeouts   int64     `json:"timeouts"`
	P50US      float64   `json:"p50_us"`
	P99US      float64   `json:"p99_us"`
	P999US     float64   `json:"p999_us"`
	MaxUS      float64   `json:"max_us"`
	RoundP99US []float64 `json:"round_p99_us"`
	// The re-send delay's median per round (rows that sampled it) and its 90th percentile.
	RoundDelayP50US []float64 `json:"round_delay_p50_us,omitempty"`
	RoundDelayP90US []float64 `json:"round_delay_p90_us,omitempty"`
	MachineCPUUS    float64   `json:"machine_cpu_us_per_req"` // busy time of both CPUs over the rounds / requests
	ClientCPUUS     float64   `json:"client_cpu_us_per_req"`
	ExtraLoad       float64   `json:"extra_load"`
	Budget          float64   `json:"budget"`
	ResendCounts
}

// TailTarget is one of the scenario's targets, as measured.
type TailTarget struct {
	Target   string `json:"target"`
	Measured string `json:"measured"`
	Met      bool   `json:"met"`
}

// TailResult is the tail scenario's result.json.
type TailResult struct {
	bench.Envelope
	Placement string        `json:"placement"`
	Rows      []TailRow     `json:"rows"`
	Summary   []TailSummary `json:"summary"`
	Targets   []TailTarget  `json:"targets"`
}

// TargetFanout is the fan-out the straggler targets are stated at.
const TargetFanout = 64

// RunTail builds a three-host lab (coord, w1, w2), starts the worker processes the modes
// need (max fan-out sockets each, pinned to WorkerCPUs) and runs, per mode, Rounds rounds
// of every fan-out with every method as a client process on CPU 0, the methods' order
// rotated by one each round.
func RunTail(ctx context.Context, o TailOptions, log io.Writer) (*TailResult, error) {
	maxF := slices.Max(o.Fanouts)
	res := &TailResult{Envelope: bench.NewEnvelope(ctx, TailSchema, "tail", map[string]any{
		"fanouts": o.Fanouts, "modes": o.Modes, "rounds": o.Rounds, "duration_s": o.Duration.Seconds(), "outstanding": o.Outstanding,
		"warmup": o.Warmup, "elems": o.Elems, "timeout_ms": o.Timeout.Milliseconds(), "loss_timeout_ms": o.LossTimeout.Milliseconds(),
		"straggle": o.Straggle, "straggle_min_ms": o.StraggleMin.Milliseconds(), "straggle_max_ms": o.StraggleMax.Milliseconds(),
		"loss": o.Loss, "seed": o.Seed, "resend_us": o.Resend.Microseconds(), "resend_quantile": o.ResendQuantile, "hedge_quantile": o.HedgeQuantile,
		"resend_min_us": o.ResendMin.Microseconds(), "max_hedges": o.MaxHedges, "max_retries": o.MaxRetries,
		"budget_ratio": o.BudgetRatio, "budget_burst": o.BudgetBurst, "worker_cpus": o.WorkerCPUs}),
		Placement: fmt.Sprintf("coordinator (client process) pinned to CPU 0 in namespace coord; every shard's first replica "+
			"a socket of one `kedge sg worker` process in namespace w1, its second one of another in w2 (straggle mode; "+
			"a straggler-free pair of processes serves kedge-clean; loss mode: one process in w1, no replicas), all worker "+
			"processes pinned to CPU %s; hosts joined by a bridge (veth; bridge netfilter off); stragglers and loss drawn "+
			"by the worker processes (seeded): a straggling reply waits %v-%v, a lost request copy is dropped on receipt "+
			"(the reply direction loses nothing)", o.WorkerCPUs, o.StraggleMin, o.StraggleMax)}
	l, err := lab.Up(lab.Spec{Name: "sgt", Fabric: lab.Bridge, Hosts: []string{"coord", "w1", "w2"}})
	if err != nil {
		return nil, err
	}
	defer l.Close()
	if err := bridgeNFOff(l); err != nil {
		return nil, err
	}
	coord, w1, w2 := l.Host("coord"), l.Host("w1"), l.Host("w2")
	ports := map[string]uint16{"straggle": 20000, "clean": 24000, "loss": 28000}
	var stops []func()
	start := func(h *lab.Host, set string, seed uint64, args ...string) error {
		a := append([]string{"--listen", fmt.Sprintf("%s+%d", netip.AddrPortFrom(h.IPv4, ports[set]), maxF), "--elems", strconv.Itoa(o.Elems),
			"--threads", "1", "--seed", strconv.FormatUint(seed, 10)}, args...)
		_, stop, err := startWorkers(o.Kedge, o.WorkerCPUs, h.Path(), a...)
		if err != nil {
			return fmt.Errorf("%s workers on %s: %w", set, h.Name, err)
		}
		stops = append(stops, stop)
		return nil
	}
	defer func() {
		for _, stop := range stops {
			stop()
		}
	}()
	strag := []string{"--straggle", fmt.Sprint(o.Straggle), "--straggle-min", o.StraggleMin.String(), "--straggle-max", o.StraggleMax.String()}
	for _, mode := range o.Modes {
		var err error
		if mode == ModeStraggle {
			err = cmpErr(start(w1, "straggle", o.Seed, strag...), start(w2, "straggle", o.Seed+1000, strag...),
				start(w1, "clean", o.Seed+2000), start(w2, "clean", o.Seed+3000))
		} else {
			err = start(w1, "loss", o.Seed+4000, "--loss", fmt.Sprint(o.Loss))
		}
		if err != nil {
			return nil, err
		}
	}
	for _, mode := range o.Modes {
		ms := tailMethods(mode, o.Before != "")
		for round := range o.Rounds {
			for _, f := range o.Fanouts {
				for k := range ms {
					m := ms[(k+round)%len(ms)]
					t0 := time.Now()
					row, err := runTailClient(ctx, o, coord, w1, w2, ports[m.workers], mode, m, f)
					if err != nil {
						return nil, fmt.Errorf("%s, round %d, fan-out %d, %s: %w", mode, round+1, f, m.name, err)
					}
					row.Round = round + 1
					fmt.Fprintf(log, "%-8s round %d fan-out %4d %-12s p50 %8.0f  p99 %8.0f  p99.9 %8.0f  max %8.0f us  %6d requests  %d timeouts  extra %.4f (budget %.4f)  CPU %.0f us/req  %s  (%.1fs)\n",
						mode, row.Round, f, m.name, row.P50US, row.P99US, row.P999US, row.MaxUS, row.Requests, row.Timeouts, row.ExtraLoad, row.Budget, row.MachineCPUUS,
						stealMark(row.StealCPUs), time.Since(t0).Seconds())
					if row.Rounds > 0 || row.Delay != nil {
						fmt.Fprintf(log, "%-8s   %d rounds, late %.0f us on average; %d refused, %d again, %d censored; %s\n", "", row.Rounds,
							meanLateUS(row.ResendCounts), row.Refused, row.Again, row.Censored, row.Delay)
					}
					res.Rows = append(res.Rows, *row)
				}
			}
		}
	}
	res.Summary = summarizeTail(res.Rows)
	res.Targets = tailTargets(res, o)
	return res, nil
}

func cmpErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func runTailClient(ctx context.Context, o TailOptions, coord, w1, w2 *lab.Host, port uint16, mode string, m tailMethod, f int) (*TailRow, error) {
	timeout := o.Timeout
	extra := []string{"--keep-latencies"}
	if mode == ModeStraggle {
		extra = append(extra, "--replicas", fmt.Sprintf("%s+%d", netip.AddrPortFrom(w2.IPv4, port), f))
	} else {
		timeout = o.LossTimeout
	}
	rounds, q := o.MaxHedges, o.HedgeQuantile
	if mode == ModeLoss {
		rounds, q = o.MaxRetries, o.ResendQuantile
	}
	burst := o.BudgetBurst
	if burst == 0 {
		burst = sg.DefaultResendBurst(f)
	}
	if m.resend {
		extra = append(extra, "--resend", o.Resend.String(), "--max-resends", strconv.Itoa(rounds), "--resend-quantile", fmt.Sprint(q),
			"--resend-min", o.ResendMin.String(), "--resend-ratio", fmt.Sprint(o.BudgetRatio), "--resend-burst", strconv.Itoa(burst))
	}
	bin := o.Kedge
	if m.before {
		bin = o.Before
	}
	w, err := runClientProc(ctx, clientProc{bin: bin, cpu: "0", netns: coord.Path(), iface: coord.Iface, method: m.client,
		workers: fmt.Sprintf("%s+%d", netip.AddrPortFrom(w1.IPv4, port), f), elems: o.Elems, lat: o.Warmup, outstanding: o.Outstanding,
		duration: o.Duration, timeout: timeout, workerPID: -1, extra: extra})
	if err != nil {
		return nil, err
	}
	cr := &w.cr
	row := &TailRow{Mode: mode, Fanout: f, Method: m.name, Requests: cr.Completed + cr.Timeouts, Timeouts: cr.Timeouts, Mismatches: cr.Mismatches,
		StealCPUs: w.steal}
	row.latencies = withTimeouts(cr.LoadedLatenciesUS, cr.Timeouts, timeout)
	row.P50US, row.P99US, row.P999US, row.MaxUS = quantiles(row.latencies)
	if cr.LoadedSec > 0 {
		row.Throughput = float64(row.Requests) / cr.LoadedSec
	}
	if row.Requests > 0 {
		row.ClientCPUUS = (cr.CPUUserSec + cr.CPUSysSec) * 1e6 / float64(row.Requests)
		row.MachineCPUUS = w.machine.Seconds() * 1e6 / float64(row.Requests)
	}
	row.Delay = cr.Delay
	if cr.Resends != nil {
		row.ResendCounts = *cr.Resends
		row.ExtraLoad, row.Budget = extraLoad(row.ResendCounts, m.resend, o.BudgetRatio, burst)
	}
	return row, nil
}

// extraLoad is re-sent copies / copies, and what the budget allows in the same terms.
func extraLoad(c ResendCounts, resend bool, ratio float64, burst int) (extra, budget float64) {
	if c.Copies == 0 {
		return 0, 0
	}
	extra = float64(c.Retries+c.Hedges) / float64(c.Copies)
	if resend {
		budget = (ratio*float64(c.Copies) + float64(burst)) / float64(c.Copies)
	}
	return extra, budget
}

// withTimeouts is the sorted latencies with each timed-out request at the timeout.
func withTimeouts(lat []float64, timeouts int64, timeout time.Duration) []float64 {
	out := slices.Clone(lat)
	for range timeouts {
		out = append(out, float64(timeout.Microseconds()))
	}
	slices.Sort(out)
	return out
}

func quantiles(sorted []float64) (p50, p99, p999, mx float64) {
	if len(sorted) == 0 {
		return 0, 0, 0, 0
	}
	return bench.Percentile(sorted, 50), bench.Percentile(sorted, 99), bench.Percentile(sorted, 99.9), sorted[len(sorted)-1]
}

func summarizeTail(rows []TailRow) []TailSummary {
	var out []TailSummary
	idx := map[[3]string]int{}
	lats := map[int][]float64{}
	var cpu, ccpu []float64
	for _, r := range rows {
		key := [3]string{r.Mode, strconv.Itoa(r.Fanout), r.Method}
		i, ok := idx[key]
		if !ok {
			i = len(out)
			idx[key] = i
			out = append(out, TailSummary{Mode: r.Mode, Fanout: r.Fanout, Method: r.Method})
			cpu, ccpu = append(cpu, 0), append(ccpu, 0)
		}
		s := &out[i]
		s.Requests += r.Requests
		s.Timeouts += r.Timeouts
		s.RoundP99US = append(s.RoundP99US, r.P99US)
		if r.Delay != nil {
			s.RoundDelayP50US, s.RoundDelayP90US = append(s.RoundDelayP50US, r.Delay.P50US), append(s.RoundDelayP90US, r.Delay.P90US)
		}
		lats[i] = append(lats[i], r.latencies...)
		cpu[i] += r.MachineCPUUS * float64(r.Requests)
		ccpu[i] += r.ClientCPUUS * float64(r.Requests)
		s.ResendCounts = s.ResendCounts.add(r.ResendCounts)
		if r.Copies > 0 && r.Budget > 0 {
			s.Budget += r.Budget * float64(r.Copies) // the bound in copies, summed over rounds
		}
	}
	for i := range out {
		s := &out[i]
		l := lats[i]
		slices.Sort(l)
		s.P50US, s.P99US, s.P999US, s.MaxUS = quantiles(l)
		if s.Requests > 0 {
			s.MachineCPUUS, s.ClientCPUUS = cpu[i]/float64(s.Requests), ccpu[i]/float64(s.Requests)
		}
		if s.Copies > 0 {
			s.ExtraLoad = float64(s.Retries+s.Hedges) / float64(s.Copies)
			s.Budget /= float64(s.Copies)
		}
	}
	return out
}

func (r *TailResult) summary(mode string, f int, method string) *TailSummary {
	for i := range r.Summary {
		if s := &r.Summary[i]; s.Mode == mode && s.Fanout == f && s.Method == method {
			return s
		}
	}
	return nil
}

// tailTargets checks the scenario's targets against the result: at fan-out 64 with
// stragglers, kedge-hedged's p99 at most 1.5x kedge-clean's and below user-hedged's in
// every round, and its extra load within the budget ratio; with loss and retries, fewer than
// 0.01% of kedge-retry's requests end by timeout at every fan-out.
func tailTargets(r *TailResult, o TailOptions) []TailTarget {
	var out []TailTarget
	f := TargetFanout
	hedged, clean, user := r.summary(ModeStraggle, f, "kedge-hedged"), r.summary(ModeStraggle, f, "kedge-clean"), r.summary(ModeStraggle, f, "user-hedged")
	if hedged != nil && clean != nil && len(hedged.RoundP99US) == len(clean.RoundP99US) {
		met := hedged.P99US <= 1.5*clean.P99US
		var rs []string
		for i, p := range hedged.RoundP99US {
			rs = append(rs, fmt.Sprintf("%.2fx", p/clean.RoundP99US[i]))
			met = met && p <= 1.5*clean.RoundP99US[i]
		}
		out = append(out, TailTarget{Target: fmt.Sprintf("fan-out %d, 1%% stragglers: kedge-hedged p99 <= 1.5x the straggler-free p99 (kedge-clean)", f),
			Measured: fmt.Sprintf("%.0f / %.0f us = %.2fx over the rounds; per round %v", hedged.P99US, clean.P99US, hedged.P99US/clean.P99US, rs), Met: met})
	}
	if hedged != nil && user != nil && len(hedged.RoundP99US) == len(user.RoundP99US) {
		met := true
		var rs []string
		for i, p := range hedged.RoundP99US {
			rs = append(rs, fmt.Sprintf("%.0f/%.0f", p, user.RoundP99US[i]))
			met = met && p < user.RoundP99US[i]
		}
		out = append(out, TailTarget{Target: fmt.Sprintf("fan-out %d, 1%% stragglers: kedge-hedged p99 below user-hedged's in every round", f),
			Measured: fmt.Sprintf("kedge-hedged/user-hedged p99 us per round %v; over the rounds %.0f/%.0f (%.2fx)", rs, hedged.P99US, user.P99US, hedged.P99US/user.P99US), Met: met})
	}
	if hedged != nil {
		// The bucket never lets the extra load past ratio x copies + burst; the target is
		// the ratio alone, in every round (the burst is for short runs of slow requests).
		met := hedged.ExtraLoad <= o.BudgetRatio
		for _, x := range r.Rows {
			if x.Mode == ModeStraggle && x.Fanout == f && x.Method == "kedge-hedged" {
				met = met && x.ExtraLoad <= o.BudgetRatio
			}
		}
		out = append(out, TailTarget{Target: fmt.Sprintf("fan-out %d, 1%% stragglers: kedge-hedged extra load within the budget (%g x copies, in every round)", f, o.BudgetRatio),
			Measured: fmt.Sprintf("%.2f%% extra copies over the rounds (%d hedges of %d copies, %d won, %d refused by the budget); user-hedged %.2f%%", 100*hedged.ExtraLoad,
				hedged.Hedges, hedged.Copies, hedged.HedgesWon, hedged.Refused, 100*userExtra(user)), Met: met})
	}
	for _, s := range r.Summary {
		if s.Mode != ModeLoss || s.Method != "kedge-retry" || s.Requests == 0 {
			continue
		}
		frac := float64(s.Timeouts) / float64(s.Requests)
		out = append(out, TailTarget{Target: fmt.Sprintf("fan-out %d, 1%% loss, retries on: < 0.01%% of requests end by timeout", s.Fanout),
			Measured: fmt.Sprintf("%d of %d (%.4f%%; %d retries, %d refused)", s.Timeouts, s.Requests, 100*frac, s.Retries, s.Refused),
			Met:      frac < 1e-4})
	}
	return out
}

func userExtra(s *TailSummary) float64 {
	if s == nil {
		return 0
	}
	return s.ExtraLoad
}

// WriteTailTable prints the summary and the targets.
func WriteTailTable(w io.Writer, r *TailResult) {
	fmt.Fprintf(w, "%-8s %-7s %-12s %8s %8s %9s %9s %9s %9s %8s %8s %9s %10s\n", "MODE", "FANOUT", "METHOD", "REQUESTS", "TIMEOUTS",
		"P50_US", "P99_US", "P99.9_US", "MAX_US", "EXTRA%", "BUDGET%", "REFUSED", "CPU_US/REQ")
	for _, s := range r.Summary {
		fmt.Fprintf(w, "%-8s %-7d %-12s %8d %8d %9.0f %9.0f %9.0f %9.0f %8.2f %8.2f %9d %10.0f\n", s.Mode, s.Fanout, s.Method, s.Requests, s.Timeouts,
			s.P50US, s.P99US, s.P999US, s.MaxUS, 100*s.ExtraLoad, 100*s.Budget, s.Refused, s.MachineCPUUS)
	}
	fmt.Fprintln(w)
	for _, t := range r.Targets {
		fmt.Fprintf(w, "%-6s %s: %s\n", metWord(t.Met), t.Target, t.Measured)
	}
	runs := make([]stealRun, len(r.Rows))
	for i, x := range r.Rows {
		runs[i] = stealRun{fmt.Sprintf("%s round %d fan-out %d %s", x.Mode, x.Round, x.Fanout, x.Method), x.StealCPUs}
	}
	writeStealRuns(w, runs)
}

func metWord(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}

// WriteTailMarkdown renders r as the tables of the documents: the pooled figures per
// mode, fan-out and method, p99 per round, and the targets; with steal readings (results
// since they were recorded), the hypervisor's steal of each round's run in CPUs.
func WriteTailMarkdown(w io.Writer, r *TailResult) {
	fmt.Fprintf(w, "Run: %s.\n\n", r.Envelope.Describe())
	delays, steal := false, false
	for _, s := range r.Summary {
		delays = delays || len(s.RoundDelayP50US) > 0
	}
	for _, x := range r.Rows {
		steal = steal || x.StealCPUs > 0
	}
	head, rule := "", ""
	if delays {
		head, rule = " delay p50 (p90) per round us | tick late us | repeats |", "---|---|---|"
	}
	if steal {
		head, rule = head+" steal per round (CPUs) |", rule+"---|"
	}
	fmt.Fprintln(w, "| mode | fan-out | method | requests | timeouts | p50 us | p99 us | p99.9 us | max us | p99 per round us | extra load | budget | hedges (won) / retries | refused | CPU us/req (client) |"+head)
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"+rule)
	for _, s := range r.Summary {
		rounds := joinUS(s.RoundP99US)
		extra, budget, resends := "-", "-", "-"
		if s.Budget > 0 {
			extra, budget = fmt.Sprintf("%.2f%%", 100*s.ExtraLoad), fmt.Sprintf("%.2f%%", 100*s.Budget)
			resends = fmt.Sprintf("%d (%d) / %d", s.Hedges, s.HedgesWon, s.Retries)
		}
		fmt.Fprintf(w, "| %s | %d | %s | %d | %d | %.0f | %.0f | %.0f | %.0f | %s | %s | %s | %s | %d | %.0f (%.0f) |", s.Mode, s.Fanout, s.Method,
			s.Requests, s.Timeouts, s.P50US, s.P99US, s.P999US, s.MaxUS, rounds, extra, budget, resends, s.Refused, s.MachineCPUUS, s.ClientCPUUS)
		if delays {
			d, late, again := "-", "-", "-"
			if len(s.RoundDelayP50US) > 0 {
				d = ""
				for i := range s.RoundDelayP50US {
					if i > 0 {
						d += ", "
					}
					d += fmt.Sprintf("%.0f (%.0f)", s.RoundDelayP50US[i], s.RoundDelayP90US[i])
				}
			}
			if s.Rounds > 0 {
				late, again = fmt.Sprintf("%.0f", meanLateUS(s.ResendCounts)), strconv.FormatInt(s.Again, 10)
			}
			fmt.Fprintf(w, " %s | %s | %s |", d, late, again)
		}
		if steal {
			fmt.Fprintf(w, " %s |", roundSteal(r.Rows, s))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| target | measured | |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, t := range r.Targets {
		fmt.Fprintf(w, "| %s | %s | %s |\n", t.Target, t.Measured, metWord(t.Met))
	}
}

// roundSteal is the steal of s's runs in CPUs, by round, comma-separated.
func roundSteal(rows []TailRow, s TailSummary) string {
	out := ""
	for _, x := range rows {
		if x.Mode != s.Mode || x.Fanout != s.Fanout || x.Method != s.Method {
			continue
		}
		if out != "" {
			out += ", "
		}
		out += fmt.Sprintf("%.2f", x.StealCPUs)
	}
	return out
}

// joinUS is figures in us, comma-separated.
func joinUS(us []float64) string {
	out := ""
	for i, p := range us {
		if i > 0 {
			out += ", "
		}
		out += fmt.Sprintf("%.0f", p)
	}
	return out
}

// WriteTailCharts writes p99 and p99.9 against fan-out per method, one chart per mode
// (tail-<mode>.png/svg), log scales.
func WriteTailCharts(dir string, r *TailResult) error {
	modes := []string{}
	for _, s := range r.Summary {
		if !slices.Contains(modes, s.Mode) {
			modes = append(modes, s.Mode)
		}
	}
	for _, mode := range modes {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("kedge bench sg --scenario tail: %s mode, p99 and p99.9 against fan-out", mode)
		p.X.Label.Text = "fan-out (log)"
		p.Y.Label.Text = "latency (us, log)"
		p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
		p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{}, plot.LogTicks{}
		var args []any
		var methods []string
		for _, s := range r.Summary {
			if s.Mode == mode && !slices.Contains(methods, s.Method) {
				methods = append(methods, s.Method)
			}
		}
		for _, m := range methods {
			var p99, p999 plotter.XYs
			for _, s := range r.Summary {
				if s.Mode == mode && s.Method == m && s.P99US > 0 {
					p99 = append(p99, plotter.XY{X: float64(s.Fanout), Y: s.P99US})
					p999 = append(p999, plotter.XY{X: float64(s.Fanout), Y: math.Max(s.P999US, s.P99US)})
				}
			}
			args = append(args, m+" p99", p99, m+" p99.9", p999)
		}
		if err := addLines(p, args...); err != nil {
			return err
		}
		p.Legend.Top = true
		p.Legend.Left = true
		if err := bench.SavePlot(p, 7*vg.Inch, 4.5*vg.Inch, filepath.Join(dir, "tail-"+mode)); err != nil {
			return err
		}
	}
	return nil
}
