package hedgebench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/hedge"
)

// RateOptions configure the rate scenario: an unmodified UDP client (the chaos baseline
// client, connected sockets, closed loops) against a server that answers at once, at a low
// load (the first level: one loop) and at saturation (the last level: many loops, many
// requests outstanding, nothing stalls), run without kedge ("unhedged"), with kedge's
// clone path (store limit 0: every request cloned into the delay line) and with its stored
// path (the default: every request stored in the kernel, hedged from a pacer tick), beside a
// control arm that is the unhedged path again (an A/A pair: what the bench reads between two
// identical arms is its own noise and bias). The arms are paired: every round runs each arm
// once, in a balanced order (armOrder: over a cycle of rounds every arm runs in every
// position, and right after every other arm, equally often), so that drift over the run
// (other work on the machine, caches) and what an arm leaves behind for the next do not
// favour one arm; ratios and differences are taken within a round and their median reported.
//
// Two chaos servers run on the server host. "fast" (port 9999) answers every request at
// once and never stalls: the differences between the arms are kedge's fast-path cost.
// "chaos" (port 9998) stalls StallPct of the ids for Stall: run with each kedge arm at
// saturation, it shows whether the hedger still rescues every stalled request there (no
// missed hedges) and loses nothing.
//
// The rounds are many and short (about a second per run) because the machine's speed drifts
// by more than the margins measured here over tens of seconds (other work, the host): a
// ratio taken between runs seconds apart cancels that drift, one taken over minutes does not.
// At saturation the client and the servers are pinned to fixed CPUs (ClientCPUs,
// ServerCPUs), the same for every arm, so that the scheduler's placement (client and server
// sharing a core or not, the softirq work on the sender's CPU) is not a difference between
// runs. The lower levels leave placement to the scheduler: with one request in flight, a
// client and server pinned apart or together both wait for wake-ups this VM makes slow
// (P50 about 190 µs, against 60-70 µs unpinned).
type RateOptions struct {
	Levels   []int         // concurrent loops per level (1, 64): first = low load, last = saturation
	N        int           // measured requests per run (10000)
	Warmup   int           // per run, discarded (500)
	Repeats  int           // rounds (16: a whole number of armOrder's cycles of four arms)
	Delay    time.Duration // hedge delay (10 ms)
	Timeout  time.Duration // client timeout (1 s)
	StallPct int           // chaos service: stalled ids (2)
	Stall    time.Duration // chaos service: stall (50 ms)
	// ProgRuns is the requests BPF_PROG_TEST_RUN times the programs on, per kedge arm (2000).
	ProgRuns int
	// SaturationN is the measured requests per run at the last level (default 4 x N): runs
	// at saturation are several times faster; this keeps them about as long as the others.
	SaturationN int
	// ClientCPUs and ServerCPUs are the CPU lists (taskset -c syntax: 0,2-3) of the client
	// and of the servers at saturation, the same for every arm; default "0" and "1" on a
	// machine with two CPUs or more, none on one. NoPin: none.
	ClientCPUs, ServerCPUs string
	NoPin                  bool
	clientSet, serverSet   *unix.CPUSet // parsed; nil: not pinned
	// Arms are the arms to run, by name (default unhedged, control, clone, stored; unhedged
	// always runs: every comparison is with it). AttributionArms lists the others.
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
	def(&o.N, 10000)
	def(&o.Warmup, 500)
	def(&o.Repeats, 16)
	def(&o.StallPct, 2)
	def(&o.ProgRuns, 2000)
	def(&o.SaturationN, 4*o.N)
	if o.NoPin {
		o.ClientCPUs, o.ServerCPUs = "", ""
	} else if o.ClientCPUs == "" && o.ServerCPUs == "" && runtime.NumCPU() >= 2 {
		o.ClientCPUs, o.ServerCPUs = "0", "1"
	}
	if (o.ClientCPUs == "") != (o.ServerCPUs == "") {
		return paramErrorf("client CPUs %q, server CPUs %q: give both or neither", o.ClientCPUs, o.ServerCPUs)
	}
	if o.ClientCPUs != "" {
		var err error
		if o.clientSet, err = parseCPUList(o.ClientCPUs); err != nil {
			return err
		}
		if o.serverSet, err = parseCPUList(o.ServerCPUs); err != nil {
			return err
		}
	}
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
	case o.Repeats < 1 || o.Repeats > maxRounds:
		return paramErrorf("repeats %d out of range 1-%d", o.Repeats, maxRounds)
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
	maxRounds = 30
	idSpan    = 10_000_000    // ids per run
	readyIDs  = 4_000_000_000 // waitReady's ids start here
)

// The arms of the rate scenario.
const (
	ArmUnhedged = "unhedged"
	// ArmControl is the unhedged path again, a second arm of the same runs: paired with
	// unhedged it reads the bench's own spread and bias (an A/A comparison). It is not the
	// hedger attached with no service matching (the idle arms below): that arm has kedge's
	// background in it and so cannot read 1.00x by construction.
	ArmControl = "control"
	ArmClone   = "clone"  // kedge, store limit 0: every request cloned into the delay line
	ArmStored  = "stored" // kedge, default store limit: every request stored in the kernel
	// The attribution arms (--arms): where the stored path's cost goes.
	ArmStoredCarry   = "stored-carry"   // store limit 512: a clone path remains, the pacer carries (conveyor: fillers)
	ArmStoredNoCarry = "stored-nocarry" // store limit 2000, above the MTU's largest payload: no clone path, no carry
	ArmIdleCarry     = "idle-carry"     // as stored-carry, but the traffic goes to an address kedge does not hedge
	ArmIdleNoCarry   = "idle-nocarry"   // as stored-nocarry, the same
)

// DefaultArms are the arms the rate scenario runs unless told otherwise.
var DefaultArms = []string{ArmUnhedged, ArmControl, ArmClone, ArmStored}

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
	arms := []rateArm{{name: ArmUnhedged}, {name: ArmControl}, {name: ArmClone, set: limit(0)}}
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
	CPUBusy float64 `json:"cpu_busy"`
	// StealCPUs is the CPU time the hypervisor took from this VM during the run, in CPUs
	// (/proc/stat's steal over the run's wall time; part of CPUBusy): the host's other work.
	StealCPUs   float64 `json:"steal_cpus"`
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
	Arm             string  `json:"arm"`
	RPS             float64 `json:"requests_per_s"`
	P50US           float64 `json:"p50_us"`
	P99US           float64 `json:"p99_us"`
	CPUPerReqUS     float64 `json:"cpu_per_request_us"`
	ProcCPUPerReqUS float64 `json:"proc_cpu_per_request_us"`
	RPSRatio        Paired  `json:"rps_ratio,omitzero"` // this arm / unhedged
	// RPSRatioBefore and RPSRatioAfter are RPSRatio split by where this arm ran in its round,
	// before the unhedged run or after it: on the control arm, the bench's order effect.
	RPSRatioBefore Paired `json:"rps_ratio_before_unhedged,omitzero"`
	RPSRatioAfter  Paired `json:"rps_ratio_after_unhedged,omitzero"`
	// RPSRatioBoth is this arm over both unhedged runs of its round, unhedged and control
	// (their geometric mean): a baseline of two runs, less noisy than one.
	RPSRatioBoth   Paired            `json:"rps_ratio_both_unhedged,omitzero"`
	DeltaP50US     Paired            `json:"delta_p50_us,omitzero"`      // this arm - unhedged
	DeltaP99US     Paired            `json:"delta_p99_us,omitzero"`      //
	CPUAddedUS     Paired            `json:"cpu_added_us,omitzero"`      // machine CPU per request
	ProcCPUAddedUS Paired            `json:"proc_cpu_added_us,omitzero"` // processes' CPU per request
	Timeouts       int               `json:"timeouts"`
	LostClones     uint64            `json:"lost_clones"`
	Counters       map[string]uint64 `json:"counters,omitempty"` // summed over the rounds
	// Per request sent, median over the rounds: /proc/softirqs by kind, and the pacer's
	// counters (kedge arms).
	SoftirqsPerReq map[string]float64 `json:"softirqs_per_request,omitempty"`
	PacerPerReq    map[string]float64 `json:"pacer_per_request,omitempty"`
	CPUSoftirq     float64            `json:"cpu_softirq"` // softirq CPUs (/proc/stat), median
	// Steal is the runs' StealCPUs, median and range over the rounds.
	Steal Paired `json:"steal_cpus,omitzero"`
}

// Paired is a per-round comparison: median and range over the rounds. N == 0: none.
// CILo..CIHi is a distribution-free confidence interval for the median (the sign test's
// order statistics, signInterval) at level CILevel (at least 0.95 where the rounds allow).
type Paired struct {
	Median  float64 `json:"median"`
	Min     float64 `json:"min"`
	Max     float64 `json:"max"`
	N       int     `json:"rounds"`
	CILo    float64 `json:"ci_lo,omitempty"`
	CIHi    float64 `json:"ci_hi,omitempty"`
	CILevel float64 `json:"ci_level,omitempty"`
}

// RateLevel summarises one concurrency level.
type RateLevel struct {
	Concurrency int        `json:"concurrency"`
	Arms        []ArmLevel `json:"arms"`
	// ByPosition is, per position in the round (0 first), a run's req/s over its arm's
	// median at this level, median and range over the runs in that position; ByPositionP50
	// the same of P50. 1.00x everywhere: the position does not matter.
	ByPosition    []Paired `json:"rps_by_position,omitempty"`
	ByPositionP50 []Paired `json:"p50_by_position,omitempty"`
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

// Targets are the rate scenario's targets (docs/hedging.md, "What a request that needs no
// hedge costs").
var Targets = struct {
	RPSRatio   float64 // stored / unhedged at saturation, at least
	CPUAddedUS float64 // CPU per request added, at most
	P50AddedUS float64 // paired P50 added at low load, at most
}{0.95, 3, 8}

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

// armOrder is the order of n arms in round k (from 0): the rows of a Williams design. Over
// orderCycle(n) rounds every arm runs in every position equally often, runs right after
// every other arm equally often (what a run leaves behind, a warm cache or a busy CPU, falls
// on each arm alike) and before every other arm in half the rounds. A plain rotation
// balances the positions only: with three arms it runs each arm after the same one in
// every round.
func armOrder(n, k int) []int {
	if n < 1 {
		return nil
	}
	row := k % orderCycle(n)
	rev := row >= n // odd n: the second half of the cycle is the first half reversed
	row %= n
	out := make([]int, n)
	for j := range n {
		b := (j + 1) / 2 // 0, 1, n-1, 2, n-2, ...
		if j%2 == 0 && j > 0 {
			b = n - j/2
		}
		out[j] = (b + row) % n
	}
	if rev {
		slices.Reverse(out)
	}
	return out
}

// orderCycle is the rounds after which armOrder repeats: n for an even number of arms, 2n
// for an odd one.
func orderCycle(n int) int {
	if n%2 == 1 && n > 1 {
		return 2 * n
	}
	return max(n, 1)
}

// RunRate runs the rate scenario and writes result.json and charts into o.OutDir.
func RunRate(ctx context.Context, o RateOptions) (RateResult, error) {
	var res RateResult
	if err := o.defaults(); err != nil {
		return res, err
	}
	arms, err := selectArms(o.Arms)
	if err != nil {
		return res, err
	}
	r, err := startRateRig(ctx, o)
	if err != nil {
		return res, err
	}
	defer r.close()
	res = RateResult{Envelope: bench.NewEnvelope(ctx, RateSchema, Rate, map[string]any{"levels": o.Levels, "n": o.N, "warmup": o.Warmup,
		"rounds": o.Repeats, "hedge_delay_ms": ms(o.Delay), "timeout_ms": ms(o.Timeout), "stall_pct": o.StallPct, "stall_ms": ms(o.Stall),
		"fast_ms": 0, "budget_fast": "ratio 0.05, burst 10000", "budget_chaos": "ratio 0.1, burst 10000", "connected": true, "payload_len": 32,
		"client": "kedge chaos client --mode baseline --connected (closed loops, one socket each)", "prog_runs": o.ProgRuns,
		"n_saturation": o.SaturationN, "saturation_client_cpus": o.ClientCPUs, "saturation_server_cpus": o.ServerCPUs}),
		IdleCPU: map[string]float64{}}
	for _, a := range arms {
		res.Arms = append(res.Arms, a.name)
	}
	if !storedPathBuilt {
		res.StoredArm = "not run: this build of the hedger has no stored path (--store-limit)"
	}
	for round := 1; round <= o.Repeats; round++ {
		for order, i := range armOrder(len(arms), round-1) {
			if err := r.runArm(&res, round, order, arms[i]); err != nil {
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

// parseCPUList parses a CPU list (taskset -c syntax: 0,2-3) of CPUs this machine has.
func parseCPUList(list string) (*unix.CPUSet, error) {
	var set unix.CPUSet
	for _, part := range strings.Split(list, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err1 := strconv.Atoi(lo)
		b, err2 := a, error(nil)
		if isRange {
			b, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || a < 0 || b < a || b >= runtime.NumCPU() {
			return nil, paramErrorf("CPU list %q: want CPUs 0-%d as in 0,2-3", list, runtime.NumCPU()-1)
		}
		for c := a; c <= b; c++ {
			set.Set(c)
		}
	}
	return &set, nil
}
