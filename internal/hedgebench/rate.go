package hedgebench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netns"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/chaos"
	"github.com/kedge-dev/kedge/internal/hedge"
	"github.com/kedge-dev/kedge/internal/pktbuild"
)

// RateOptions configure the rate scenario: an unmodified UDP client (the chaos baseline
// client, connected sockets, closed loops) against a server that answers at once, at a low
// load (the first level: one loop) and at saturation (the last level: many loops, many
// requests outstanding, nothing stalls), run without kedge ("unhedged"), with kedge's
// clone path (store limit 0: every request cloned into the delay line) and with its stored
// path (the default: every request stored in the kernel, hedged from a pacer tick). The
// arms are paired: every round runs each arm once, in an order rotated per round (round
// robin), so that drift over the run (other work on the machine, caches) does not favour
// one arm; ratios and differences are taken within a round and their median reported.
//
// Two chaos servers run on the server host. "fast" (port 9999) answers every request at
// once and never stalls: the differences between the arms are kedge's fast-path cost.
// "chaos" (port 9998) stalls StallPct of the ids for Stall: run with each kedge arm at
// saturation, it shows whether the hedger still rescues every stalled request there (no
// missed hedges) and loses nothing.
type RateOptions struct {
	Levels   []int         // concurrent loops per level (1, 64): first = low load, last = saturation
	N        int           // measured requests per run (30000)
	Warmup   int           // per run, discarded (500)
	Repeats  int           // rounds (5)
	Delay    time.Duration // hedge delay (10 ms)
	Timeout  time.Duration // client timeout (1 s)
	StallPct int           // chaos service: stalled ids (2)
	Stall    time.Duration // chaos service: stall (50 ms)
	// ProgRuns is the requests BPF_PROG_TEST_RUN times the programs on, per kedge arm (2000).
	ProgRuns int
	// SaturationN is the measured requests per run at the last level (default 5 x N): runs
	// at saturation are several times faster, and a longer one evens out the machine's noise.
	SaturationN int
	// Arms are the arms to run, by name (default unhedged, clone, stored; unhedged always
	// runs: every comparison is with it). AttributionArms lists the others.
	Arms    []string
	Backend string
	Exe     string
	OutDir  string
	Log     *slog.Logger
}

func (o *RateOptions) defaults() error {
	if len(o.Levels) == 0 {
		o.Levels = []int{1, 64}
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
	def(&o.N, 30000)
	def(&o.Warmup, 500)
	def(&o.Repeats, 5)
	def(&o.StallPct, 2)
	def(&o.ProgRuns, 2000)
	def(&o.SaturationN, 5*o.N)
	if len(o.Arms) == 0 {
		o.Arms = DefaultArms
	}
	if _, err := selectArms(o.Arms); err != nil {
		return err
	}
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
	case o.N < 100 || o.SaturationN < 100:
		return paramErrorf("%d requests per run (%d at saturation): need at least 100", o.N, o.SaturationN)
	case o.Stall <= o.Delay:
		return paramErrorf("stall %v must exceed the hedge delay %v, or there is nothing to rescue", o.Stall, o.Delay)
	case o.Stall >= o.Timeout:
		return paramErrorf("stall %v must be below the timeout %v", o.Stall, o.Timeout)
	}
	// Every run gets its own id range of idSpan ids (see runClient); the programs' test
	// runs take the range after the last run's.
	if runs := len(o.Levels)*o.Repeats*len(o.Arms) + len(o.Arms)*o.Repeats + len(o.Arms) + 1; uint64(runs+1)*idSpan > readyIDs {
		return paramErrorf("%d runs do not fit in 32-bit request ids: fewer levels or repeats", runs)
	}
	if uint64(max(o.N, o.SaturationN)+o.Warmup)+uint64(max(len(o.Levels), 1))*100 > idSpan || o.ProgRuns > idSpan/2 {
		return paramErrorf("%d requests per run: at most %d", max(o.N, o.SaturationN)+o.Warmup, idSpan/2)
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

// The arms of the rate scenario.
const (
	ArmUnhedged = "unhedged"
	ArmClone    = "clone"  // kedge, store limit 0: every request cloned into the delay line
	ArmStored   = "stored" // kedge, default store limit: every request stored in the kernel
	// The attribution arms (--arms): where the stored path's cost goes.
	ArmStoredCarry   = "stored-carry"   // store limit 512: a clone path remains, the pacer carries (conveyor: fillers)
	ArmStoredNoCarry = "stored-nocarry" // store limit 2000, above the MTU's largest payload: no clone path, no carry
	ArmIdleCarry     = "idle-carry"     // as stored-carry, but the traffic goes to an address kedge does not hedge
	ArmIdleNoCarry   = "idle-nocarry"   // as stored-nocarry, the same
)

// DefaultArms are the arms the rate scenario runs unless told otherwise.
var DefaultArms = []string{ArmUnhedged, ArmClone, ArmStored}

// AttributionArms are the arms that take the stored path's cost apart: the store limit
// with and without a clone path (the conveyor's fillers), and the hedger attached with
// nothing to hedge (its background alone: fillers, the programs on traffic they pass).
var AttributionArms = []string{ArmStoredCarry, ArmStoredNoCarry, ArmIdleCarry, ArmIdleNoCarry}

// rateArm is one way of running the client: without kedge, or with kedge configured by set.
// An idle arm's services are at addresses the client does not use: kedge sees the traffic
// and hedges none of it.
type rateArm struct {
	name string
	set  func(*hedge.ServiceConfig) // nil: no kedge
	idle bool
}

// rateArms lists every arm this build can run: the stored arms only once the hedger has a
// stored path (storedPathBuilt).
func rateArms() []rateArm {
	limit := func(n int) func(*hedge.ServiceConfig) {
		return func(s *hedge.ServiceConfig) { setStoreLimit(s, n) }
	}
	arms := []rateArm{{name: ArmUnhedged}, {name: ArmClone, set: limit(0)}}
	if storedPathBuilt {
		arms = append(arms, rateArm{name: ArmStored, set: func(*hedge.ServiceConfig) {}},
			rateArm{name: ArmStoredCarry, set: limit(512)}, rateArm{name: ArmStoredNoCarry, set: limit(hedge.MaxStoreLimit)},
			rateArm{name: ArmIdleCarry, set: limit(512), idle: true}, rateArm{name: ArmIdleNoCarry, set: limit(hedge.MaxStoreLimit), idle: true})
	}
	return arms
}

// selectArms returns the arms named, unhedged first, in the order given.
func selectArms(names []string) ([]rateArm, error) {
	all := rateArms()
	out := []rateArm{all[0]}
	for _, n := range names {
		i := slices.IndexFunc(all, func(a rateArm) bool { return a.name == n })
		switch {
		case i < 0:
			var known []string
			for _, a := range all {
				known = append(known, a.name)
			}
			return nil, paramErrorf("arm %q unknown: use %s", n, strings.Join(known, ", "))
		case i == 0:
			continue
		case slices.ContainsFunc(out, func(a rateArm) bool { return a.name == n }):
			return nil, paramErrorf("arm %q given twice", n)
		}
		out = append(out, all[i])
	}
	return out, nil
}

// RateRun is one client run.
type RateRun struct {
	Concurrency int    `json:"concurrency"`
	Round       int    `json:"round"`
	Order       int    `json:"order"` // position of the arm in its round (0 first)
	Arm         string `json:"arm"`
	Service     string `json:"service"` // fast or chaos
	Requests    int    `json:"requests"`
	// Sent is the requests the client sent, warm-up included (what the CPU figures divide).
	Sent     int     `json:"sent"`
	ElapsedS float64 `json:"elapsed_s"`
	RPS      float64 `json:"requests_per_s"`
	// Latency percentiles of the requests the server answers at once (every request of
	// the fast service, the non-stalled ones of the chaos service), in µs.
	P50US  float64 `json:"p50_us"`
	P99US  float64 `json:"p99_us"`
	P999US float64 `json:"p99_9_us"`
	MaxUS  float64 `json:"max_us"`
	// Timeouts and LateDuplicates as the application saw them.
	Timeouts       int `json:"timeouts"`
	LateDuplicates int `json:"late_duplicates"`
	// CPU, machine: busy time of all CPUs during the run (/proc/stat: every process, the
	// softirq work, and whatever else ran on the machine), in CPUs (2.0 = both cores busy),
	// its softirq part, and busy CPU time per request sent in µs.
	CPUBusy     float64 `json:"cpu_busy"`
	CPUSoftirq  float64 `json:"cpu_softirq"`
	CPUPerReqUS float64 `json:"cpu_per_request_us"`
	// CPU, processes: the CPU time (user + system) of the processes involved, per request
	// sent, in µs: the client (rusage), both chaos servers and the ksoftirqd threads
	// (/proc/<pid>/stat), and this process (the benchmark driver with kedge's control
	// plane). Softirq work is in the time of the task it interrupted (tick accounting) or
	// of ksoftirqd; other engineers' processes are not in it.
	ProcCPUPerReqUS float64            `json:"proc_cpu_per_request_us"`
	ProcCPUUS       map[string]float64 `json:"proc_cpu_us"` // per request, by process
	// With kedge: the hedger's counters over the run (measured and warm-up requests), and
	// the pacer's (ticks, tick passes, filler passes: its work in the background).
	Counters map[string]uint64 `json:"counters,omitempty"`
	Pacer    map[string]uint64 `json:"pacer,omitempty"`
	// Softirqs is /proc/softirqs over the run, per kind, summed over the CPUs.
	Softirqs map[string]uint64 `json:"softirqs,omitempty"`
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

// ArmLevel is one arm at one level: medians over the rounds, and (for a kedge arm) the
// medians of the per-round comparisons with the unhedged run of the same round.
type ArmLevel struct {
	Arm             string            `json:"arm"`
	RPS             float64           `json:"requests_per_s"`
	P50US           float64           `json:"p50_us"`
	P99US           float64           `json:"p99_us"`
	CPUPerReqUS     float64           `json:"cpu_per_request_us"`
	ProcCPUPerReqUS float64           `json:"proc_cpu_per_request_us"`
	RPSRatio        Paired            `json:"rps_ratio,omitzero"`         // this arm / unhedged
	DeltaP50US      Paired            `json:"delta_p50_us,omitzero"`      // this arm - unhedged
	DeltaP99US      Paired            `json:"delta_p99_us,omitzero"`      //
	CPUAddedUS      Paired            `json:"cpu_added_us,omitzero"`      // machine CPU per request
	ProcCPUAddedUS  Paired            `json:"proc_cpu_added_us,omitzero"` // processes' CPU per request
	Timeouts        int               `json:"timeouts"`
	LostClones      uint64            `json:"lost_clones"`
	Counters        map[string]uint64 `json:"counters,omitempty"` // summed over the rounds
	// Per request sent, median over the rounds: /proc/softirqs by kind, and the pacer's
	// counters (kedge arms).
	SoftirqsPerReq map[string]float64 `json:"softirqs_per_request,omitempty"`
	PacerPerReq    map[string]float64 `json:"pacer_per_request,omitempty"`
	CPUSoftirq     float64            `json:"cpu_softirq"` // softirq CPUs (/proc/stat), median
}

// Paired is a per-round comparison: median and range over the rounds. N == 0: none.
type Paired struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	N      int     `json:"rounds"`
}

func paired(v []float64) Paired {
	if len(v) == 0 {
		return Paired{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return Paired{Median: pct(s, 50), Min: s[0], Max: s[len(s)-1], N: len(s)}
}

// RateLevel summarises one concurrency level.
type RateLevel struct {
	Concurrency int        `json:"concurrency"`
	Arms        []ArmLevel `json:"arms"`
}

// ChaosCheck is a kedge arm's runs of the stalling service at saturation, summed over
// the rounds.
type ChaosCheck struct {
	Arm             string  `json:"arm"`
	Concurrency     int     `json:"concurrency"`
	RPS             float64 `json:"requests_per_s"` // median
	Stalled         int     `json:"stalled"`
	Missed          int     `json:"missed_hedges"`
	LostClones      uint64  `json:"lost_clones"`
	Timeouts        int     `json:"timeouts"`
	BudgetExhausted uint64  `json:"budget_exhausted"`
	RescueP50US     float64 `json:"rescue_p50_us"` // median over the rounds
	RescueMaxUS     float64 `json:"rescue_max_us"` // max over the rounds
	// Counters are the hedger's counters of these runs, summed.
	Counters map[string]uint64 `json:"counters,omitempty"`
}

// ProgTime is the kernel's run time of kedge's programs per request (BPF_PROG_TEST_RUN,
// one run per packet), on one arm's hedger, with the counters the runs moved (which path).
type ProgTime struct {
	Arm      string            `json:"arm"`
	Requests int               `json:"requests"`
	SplitNS  float64           `json:"split_ns"`
	RespNS   float64           `json:"resp_ns"`
	Counters map[string]uint64 `json:"counters"`
}

// Targets are issue 14's targets for the rate scenario.
var Targets = struct {
	RPSRatio   float64 // stored / unhedged at saturation, at least
	CPUAddedUS float64 // CPU per request added, at most
	P50AddedUS float64 // paired P50 added at low load, at most
}{0.9, 3, 8}

// RateResult is the rate scenario's result.json.
type RateResult struct {
	bench.Envelope
	Backend string   `json:"backend"`
	Arms    []string `json:"arms"`
	// StoredArm says why the stored arm is missing, when it is.
	StoredArm string `json:"stored_arm,omitempty"`
	// IdleCPU is the busy CPUs with no traffic, per arm (the hedger attached, nothing sent):
	// the conveyor's fillers circulate whether or not requests flow.
	IdleCPU map[string]float64 `json:"idle_cpu"`
	Runs    []RateRun          `json:"runs"`
	Levels  []RateLevel        `json:"levels"`
	Chaos   []ChaosCheck       `json:"chaos"`
	Prog    []ProgTime         `json:"programs"`
}

// RateSchema versions RateResult.
const RateSchema = "kedge.bench.rate/v2"

// rotate returns arms starting at position k (round-robin order for round k).
func rotate[T any](arms []T, k int) []T {
	k %= len(arms)
	return append(slices.Clone(arms[k:]), arms[:k]...)
}

// RunRate runs the rate scenario and writes result.json and charts into o.OutDir.
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
	var serverPIDs []int
	for _, s := range []struct {
		at  netip.AddrPort
		pct int
	}{{fast, 0}, {slow, o.StallPct}} {
		pid, stop, err := bench.StartProcessPID(srv, o.Exe, serverArgs([]netip.AddrPort{s.at},
			chaos.Config{StallPct: s.pct, Stall: o.Stall, TTL: time.Second})...)
		if err != nil {
			return res, fmt.Errorf("start chaos server: %w", err)
		}
		defer stop()
		serverPIDs = append(serverPIDs, pid)
	}
	for _, a := range []netip.AddrPort{fast, slow} {
		if err := waitReady(ctx, client, a); err != nil {
			return res, err
		}
	}
	softirqPIDs, err := bench.KsoftirqdPIDs()
	if err != nil {
		return res, err
	}
	arms, err := selectArms(o.Arms)
	if err != nil {
		return res, err
	}
	res = RateResult{Envelope: bench.NewEnvelope(ctx, RateSchema, Rate, map[string]any{"levels": o.Levels, "n": o.N, "warmup": o.Warmup,
		"rounds": o.Repeats, "hedge_delay_ms": ms(o.Delay), "timeout_ms": ms(o.Timeout), "stall_pct": o.StallPct, "stall_ms": ms(o.Stall),
		"fast_ms": 0, "budget_fast": "ratio 0.05, burst 10000", "budget_chaos": "ratio 0.1, burst 10000", "connected": true, "payload_len": 32,
		"client": "kedge chaos client --mode baseline --connected (closed loops, one socket each)", "prog_runs": o.ProgRuns,
		"n_saturation": o.SaturationN}),
		IdleCPU: map[string]float64{}}
	for _, a := range arms {
		res.Arms = append(res.Arms, a.name)
	}
	if !storedPathBuilt {
		res.StoredArm = "not run: this build of the hedger has no stored path (--store-limit)"
	}
	config := func(a rateArm) *hedge.Config {
		cfg := &hedge.Config{Interface: client.Iface, DelayLine: hedge.DelayLineConfig{Backend: o.Backend},
			Services: []hedge.ServiceConfig{
				// The budget is not what this scenario measures: wide enough that every
				// request can be hedged (with the bucket, a clone holds a token while it
				// rides the delay line: burst >= requests/s x delay, docs/hedging.md).
				{Name: "fast", Address: fast.String(), Delay: hedge.DelaySpec{Fixed: o.Delay}, Budget: hedge.BudgetSpec{Ratio: 0.05, Burst: 10000}},
				// The loops' stalls come in synchronised bursts (every loop meets ids ending
				// in 00 and 01 at about the same time); refusals would still be counted.
				{Name: "chaos", Address: slow.String(), Delay: hedge.DelaySpec{Fixed: o.Delay}, Budget: hedge.BudgetSpec{Ratio: 0.1, Burst: 10000}},
			}}
		for i := range cfg.Services {
			a.set(&cfg.Services[i])
			if a.idle { // a port nobody sends to: kedge passes every request
				ap := netip.MustParseAddrPort(cfg.Services[i].Address)
				cfg.Services[i].Address = netip.AddrPortFrom(ap.Addr(), ap.Port()+100).String()
			}
		}
		return cfg
	}

	next := uint32(0) // run counter: id ranges
	last := o.Levels[len(o.Levels)-1]
	sample := func() (procSample, error) { return readProcs(serverPIDs, softirqPIDs) }
	runClient := func(c, round, order int, arm, svc string, to netip.AddrPort, h *hedge.Hedger) (RateRun, error) {
		next++
		run := RateRun{Concurrency: c, Round: round, Order: order, Arm: arm, Service: svc}
		path := filepath.Join(o.OutDir, fmt.Sprintf("c%d-r%d-%s-%s.json", c, round, svc, arm))
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
		sirq0, err := readSoftirqs()
		if err != nil {
			return run, err
		}
		p0, err := sample()
		if err != nil {
			return run, err
		}
		n := o.N
		if c == last {
			n = o.SaturationN
		}
		o.Log.Info("rate run", "concurrency", c, "round", round, "arm", arm, "service", svc, "requests", n)
		clientCPU, err := bench.RunProcessCPU(ctx, client, io.Discard, o.Exe, "chaos", "client", "--mode", "baseline", "--connected",
			"--target", to.String(), "-n", fmt.Sprint(n), "--warmup", fmt.Sprint(o.Warmup),
			"--concurrency", fmt.Sprint(c), "--timeout", o.Timeout.String(), "--base-id", fmt.Sprint(next*idSpan),
			"--scenario", Rate, "--name", filepath.Base(path), "--out", path)
		p1, perr := sample()
		cpu1, cerr := bench.ReadCPU()
		sirq1, serr := readSoftirqs()
		if err = errors.Join(err, perr, cerr, serr); err != nil {
			return run, err
		}
		run.Softirqs = diffCounters(sirq1, sirq0)
		if h != nil { // the pacer's work during the run, before the settling below
			mid, err := h.Stats()
			if err != nil {
				return run, err
			}
			run.Pacer = diffCounters(mid.DelayLine, before.DelayLine)
		}
		r, err := bench.ReadFile(path)
		if err != nil {
			return run, err
		}
		_ = os.Remove(path) // per-request data of every run would be ~100 MB; result.json keeps the summary
		if len(r.Series) != 1 {
			return run, fmt.Errorf("%s: %d series, want 1", path, len(r.Series))
		}
		stallPct := 0
		if svc == "chaos" {
			stallPct = o.StallPct
		}
		run.Sent = n + o.Warmup
		summarizeRun(&run, r.Series[0], cpu1.Sub(cpu0), stallPct, o.Stall)
		run.ProcCPUUS = p1.sub(p0, clientCPU).perRequest(run.Sent)
		for _, v := range run.ProcCPUUS {
			run.ProcCPUPerReqUS += v
		}
		if h != nil {
			if run.Counters, _, run.LostClones, err = settledCounters(h, svc, before, o.Delay); err != nil {
				return run, err
			}
		}
		return run, nil
	}

	for round := 1; round <= o.Repeats; round++ {
		for order, a := range rotate(arms, round-1) {
			var h *hedge.Hedger
			if a.set != nil {
				if h, err = hedge.Start(config(a), hedge.Options{Netns: client.Handle, Backend: o.Backend, Log: o.Log}); err != nil {
					return res, fmt.Errorf("start kernel hedger (%s arm): %w", a.name, err)
				}
				res.Backend = h.Backend
			}
			err := func() error {
				if _, ok := res.IdleCPU[a.name]; !ok {
					idle, err := bench.IdleCPU(ctx, time.Second)
					if err != nil {
						return err
					}
					res.IdleCPU[a.name] = idle
				}
				for _, c := range o.Levels {
					run, err := runClient(c, round, order, a.name, "fast", fast, h)
					if err != nil {
						return err
					}
					res.Runs = append(res.Runs, run)
				}
				if h == nil || a.idle {
					return nil
				}
				run, err := runClient(last, round, order, a.name, "chaos", slow, h)
				if err != nil {
					return err
				}
				res.Runs = append(res.Runs, run)
				if round == 1 {
					next++
					pt, err := measurePrograms(h, client.Handle, netip.AddrPortFrom(client.IPv4, 40000), next*idSpan, o.ProgRuns, o.Delay)
					if err != nil {
						return err
					}
					pt.Arm = a.name
					res.Prog = append(res.Prog, pt)
				}
				return nil
			}()
			if h != nil {
				err = errors.Join(err, h.Close())
			}
			if err != nil {
				return res, err
			}
		}
	}
	res.Levels, res.Chaos = rateLevels(res.Runs, o.Levels, res.Arms), chaosChecks(res.Runs, res.Arms)
	if err := bench.WriteJSON(filepath.Join(o.OutDir, "result.json"), res); err != nil {
		return res, err
	}
	return res, writeRateCharts(o.OutDir, res)
}

// settledCounters waits for the last clones to leave the delay line and returns the
// service's counters and the pacer's since before, and the clones lost.
func settledCounters(h *hedge.Hedger, svc string, before *hedge.Snapshot, delay time.Duration) (map[string]uint64, map[string]uint64, *uint64, error) {
	time.Sleep(delay + 50*time.Millisecond) // a clone is due after delay: nothing to poll for "none in flight"
	after, err := h.Stats()
	if err != nil {
		return nil, nil, nil, err
	}
	i := slices.IndexFunc(after.Services, func(s hedge.ServiceStats) bool { return s.Name == svc })
	c := diffCounters(after.Services[i].Counters, before.Services[i].Counters)
	dl := diffCounters(after.DelayLine, before.DelayLine)
	lost := sub0(dl["carried_in"], dl["carried_out"]) + c["clone_errors"]
	return c, dl, &lost, nil
}

// measurePrograms times the programs of h on the fast service (index 0) and records
// which path the test runs took. The requests go in batches of progBatch with a pause of
// three delays between batches: the test runs are far faster than traffic, and the stored
// path's ring frees a cell only once its request is due, so an unpaced loop would fill it
// and time the clone fallback instead.
func measurePrograms(h *hedge.Hedger, ns netns.NsHandle, client netip.AddrPort, firstID uint32, n int, delay time.Duration) (ProgTime, error) {
	before, err := h.Stats()
	if err != nil {
		return ProgTime{}, err
	}
	var split, resp time.Duration
	for done := 0; done < n; done += progBatch {
		if done > 0 {
			time.Sleep(3 * delay) // the batch's requests come due and leave the ring: nothing to poll per cell
		}
		k := min(progBatch, n-done)
		reqs, resps, err := progFrames(h.Config.Services[0], client, firstID+uint32(done), k, 32)
		if err != nil {
			return ProgTime{}, err
		}
		pt, err := h.MeasurePrograms(ns, reqs, resps)
		if err != nil {
			return ProgTime{}, err
		}
		split, resp = split+pt.Split*time.Duration(k), resp+pt.Resp*time.Duration(k)
	}
	c, _, _, err := settledCounters(h, "fast", before, delay)
	if err != nil {
		return ProgTime{}, err
	}
	return ProgTime{Requests: n, SplitNS: float64(split.Nanoseconds()) / float64(n), RespNS: float64(resp.Nanoseconds()) / float64(n), Counters: c}, nil
}

// progFrames builds n requests from client to service s, ids from firstID upwards, and their
// responses, payloadLen bytes each (the id in the service's id field), for MeasurePrograms.
func progFrames(s hedge.ServiceConfig, client netip.AddrPort, firstID uint32, n, payloadLen int) (reqs, resps [][]byte, err error) {
	svc, err := netip.ParseAddrPort(s.Address)
	if err != nil {
		return nil, nil, fmt.Errorf("measure programs: service address %q: %w", s.Address, err)
	}
	id := s.RequestID
	if id.Length > 4 || payloadLen < id.Offset+4 {
		return nil, nil, fmt.Errorf("measure programs: request id of %d bytes at %d in %d-byte payloads: want at most 4 bytes inside the payload", id.Length, id.Offset, payloadLen)
	}
	if client.Addr().Is4() != svc.Addr().Is4() {
		return nil, nil, fmt.Errorf("measure programs: client %s and service %s differ in address family", client, svc)
	}
	frame := func(from, to netip.AddrPort, reqID uint32) []byte {
		p := make([]byte, payloadLen)
		binary.BigEndian.PutUint32(p[id.Offset:], reqID<<(8*(4-id.Length)))
		b := pktbuild.New()
		if from.Addr().Is4() {
			b = b.IPv4(pktbuild.IPv4{Src: from.Addr(), Dst: to.Addr()})
		} else {
			b = b.IPv6(pktbuild.IPv6{Src: from.Addr(), Dst: to.Addr()})
		}
		return b.UDP(pktbuild.UDP{Src: from.Port(), Dst: to.Port()}).Payload(p).Build()
	}
	for i := range n {
		rid := firstID + uint32(i)
		reqs = append(reqs, frame(client, svc, rid))
		resps = append(resps, frame(svc, client, rid))
	}
	return reqs, resps, nil
}

// progBatch is the requests timed back to back (well below the store ring's 1024 cells).
const progBatch = 200

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

// procSample is the CPU time of the processes a run involves, read at one moment.
type procSample struct {
	servers, softirq, self time.Duration
}

func readProcs(servers, softirq []int) (procSample, error) {
	var s procSample
	for _, pid := range servers {
		d, err := bench.ProcCPU(pid)
		if err != nil {
			return s, err
		}
		s.servers += d
	}
	for _, pid := range softirq {
		d, err := bench.ProcCPU(pid)
		if err != nil {
			return s, err
		}
		s.softirq += d
	}
	var err error
	s.self, err = bench.SelfCPU()
	return s, err
}

// procCPU is the CPU time each process used over a run.
type procCPU struct {
	client, servers, softirq, self time.Duration
}

func (b procSample) sub(a procSample, client time.Duration) procCPU {
	return procCPU{client: client, servers: b.servers - a.servers, softirq: b.softirq - a.softirq, self: b.self - a.self}
}

func (p procCPU) perRequest(n int) map[string]float64 {
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(max(n, 1)) }
	return map[string]float64{"client": us(p.client), "servers": us(p.servers), "ksoftirqd": us(p.softirq), "kedge": us(p.self)}
}

// summarizeRun fills run's latency, CPU and stall figures from series s. The CPU per
// request divides by run.Sent (warm-up included: the CPU was read around the whole run),
// or by the measured requests when Sent is not set.
func summarizeRun(run *RateRun, s bench.Series, cpu bench.CPUTimes, stallPct int, stall time.Duration) {
	run.Requests, run.ElapsedS = s.Requests(), s.ElapsedS
	if run.Sent == 0 {
		run.Sent = run.Requests
	}
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
	if run.Sent > 0 {
		run.CPUPerReqUS = float64(cpu.Busy.Microseconds()) / float64(run.Sent)
	}
}

// rateLevels summarises the fast-service runs per level and arm: medians over the rounds,
// and per kedge arm the medians of its comparisons with the unhedged run of its round.
func rateLevels(runs []RateRun, levels []int, arms []string) []RateLevel {
	out := make([]RateLevel, 0, len(levels))
	for _, c := range levels {
		lv := RateLevel{Concurrency: c}
		byRound := map[string]map[int]*RateRun{}
		for i := range runs {
			r := &runs[i]
			if r.Concurrency != c || r.Service != "fast" {
				continue
			}
			if byRound[r.Arm] == nil {
				byRound[r.Arm] = map[int]*RateRun{}
			}
			byRound[r.Arm][r.Round] = r
		}
		for _, arm := range arms {
			al := ArmLevel{Arm: arm}
			var rps, p50, p99, cpu, pcpu, ratio, dp50, dp99, dcpu, dpcpu, sirq []float64
			sirqs, pacer := map[string][]float64{}, map[string][]float64{}
			for round, r := range byRound[arm] {
				rps, p50, p99 = append(rps, r.RPS), append(p50, r.P50US), append(p99, r.P99US)
				sirq = append(sirq, r.CPUSoftirq)
				perReq(sirqs, r.Softirqs, r.Sent)
				perReq(pacer, r.Pacer, r.Sent)
				cpu, pcpu = append(cpu, r.CPUPerReqUS), append(pcpu, r.ProcCPUPerReqUS)
				al.Timeouts += r.Timeouts
				if r.LostClones != nil {
					al.LostClones += *r.LostClones
				}
				for k, v := range r.Counters {
					if al.Counters == nil {
						al.Counters = map[string]uint64{}
					}
					al.Counters[k] += v
				}
				u := byRound[ArmUnhedged][round]
				if arm == ArmUnhedged || u == nil {
					continue
				}
				if u.RPS > 0 {
					ratio = append(ratio, r.RPS/u.RPS)
				}
				dp50, dp99 = append(dp50, r.P50US-u.P50US), append(dp99, r.P99US-u.P99US)
				dcpu, dpcpu = append(dcpu, r.CPUPerReqUS-u.CPUPerReqUS), append(dpcpu, r.ProcCPUPerReqUS-u.ProcCPUPerReqUS)
			}
			al.RPS, al.P50US, al.P99US, al.CPUPerReqUS, al.ProcCPUPerReqUS = median(rps), median(p50), median(p99), median(cpu), median(pcpu)
			al.RPSRatio, al.DeltaP50US, al.DeltaP99US = paired(ratio), paired(dp50), paired(dp99)
			al.CPUAddedUS, al.ProcCPUAddedUS = paired(dcpu), paired(dpcpu)
			al.SoftirqsPerReq, al.PacerPerReq, al.CPUSoftirq = medians(sirqs), medians(pacer), median(sirq)
			lv.Arms = append(lv.Arms, al)
		}
		out = append(out, lv)
	}
	return out
}

// chaosChecks sums the stalling service's runs per kedge arm.
func chaosChecks(runs []RateRun, arms []string) []ChaosCheck {
	var out []ChaosCheck
	for _, arm := range arms {
		cc := ChaosCheck{Arm: arm}
		var rps, resc []float64
		for _, r := range runs {
			if r.Arm != arm || r.Service != "chaos" {
				continue
			}
			cc.Concurrency = r.Concurrency
			rps, resc = append(rps, r.RPS), append(resc, r.RescueP50US)
			cc.Stalled += r.Stalled
			cc.Timeouts += r.Timeouts
			cc.BudgetExhausted += r.Counters["budget_exhausted"]
			cc.RescueMaxUS = max(cc.RescueMaxUS, r.RescueMaxUS)
			for k, v := range r.Counters {
				if cc.Counters == nil {
					cc.Counters = map[string]uint64{}
				}
				cc.Counters[k] += v
			}
			if r.Missed != nil {
				cc.Missed += *r.Missed
			}
			if r.LostClones != nil {
				cc.LostClones += *r.LostClones
			}
		}
		if len(rps) == 0 {
			continue
		}
		cc.RPS, cc.RescueP50US = median(rps), median(resc)
		out = append(out, cc)
	}
	return out
}

// perReq appends each counter of c divided by n to acc.
func perReq(acc map[string][]float64, c map[string]uint64, n int) {
	for k, v := range c {
		acc[k] = append(acc[k], float64(v)/float64(max(n, 1)))
	}
}

// medians is the median of each list (nil for none).
func medians(acc map[string][]float64) map[string]float64 {
	if len(acc) == 0 {
		return nil
	}
	out := make(map[string]float64, len(acc))
	for k, v := range acc {
		out[k] = median(v)
	}
	return out
}

// median is bench.Median, 0 for no values (JSON has no NaN).
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	return bench.Median(v)
}

// pct is bench.Percentile with 0 for no values (JSON has no NaN).
func pct(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return bench.Percentile(sorted, p)
}
