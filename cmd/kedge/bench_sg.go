package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/sgbench"
	"github.com/spf13/cobra"
)

func init() {
	registerBench(newBenchSgCmd)
	registerBench(newBenchSgClientCmd)
}

func newBenchSgCmd() *cobra.Command {
	o := sgbench.DefaultOptions()
	lo := sgbench.DefaultLoopOptions()
	to := sgbench.DefaultTailOptions()
	var fanouts []int
	var from, scenario string
	cmd := &cobra.Command{
		Use:   "sg",
		Short: "Scatter-gather: kedge against naive, sendmmsg/recvmmsg, epoll, busy-poll and io_uring baselines",
		Long: `Runs kedge's in-kernel scatter-gather and user-space baselines (each matching replies by
request id, one unconnected socket, the same requests outstanding) against the same worker
processes in a two-host lab, fan-out by fan-out, methods alternating. Prints per method
and fan-out: unloaded p50/p99, throughput under load, CPU and system calls per request,
and the kedge/best-baseline ratios; writes result.json and charts under --out.`,
		Example: `  kedge bench sg
  kedge bench sg --fanouts 16,64 --duration 1s --out /tmp/sg
  # the setup kedge and sgbpf were compared in (loopback, 256 x int32, 1 and 32 outstanding),
  # alternating with an earlier build of kedge, 3 rounds
  kedge bench sg --scenario loopback --before /tmp/kedge-old --out results/sg-loopback
  # fan-out with stragglers (1%, 20-50 ms) and with 1% loss: kedge unhedged, hedged in the
  # kernel, and the user-space baseline with the same hedging, shards of 2 replicas
  kedge bench sg --scenario tail --out results/sg-tail
  kedge bench sg --scenario tail --modes loss --fanouts 64 --rounds 5
  # the tables of docs/benchmarks.md from a result (nothing is run)
  kedge bench sg --from docs/results/sg/result.json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if from != "" {
				return writeSgFrom(cmd.OutOrStdout(), from)
			}
			if scenario == "loopback" {
				return runBenchSgLoopback(cmd, lo, fanouts, o)
			}
			if scenario == "tail" {
				return runBenchSgTail(cmd, to, lo.Rounds, fanouts, o, lo.Before)
			}
			if scenario != "fanout" {
				return usagef("--scenario %q: want fanout, loopback or tail", scenario)
			}
			if err := checkFanouts(fanouts); err != nil {
				return err
			}
			for _, m := range o.Methods {
				ok := false
				for _, k := range sgbench.AllMethods {
					ok = ok || m == k
				}
				if !ok {
					return usagef("--methods: unknown method %q (want %v)", m, sgbench.AllMethods)
				}
			}
			if o.WorkerThreads < 1 {
				return usagef("--worker-threads %d: want at least 1", o.WorkerThreads)
			}
			if o.Outstanding < 1 || o.Duration <= 0 || o.LatRequests < 1 {
				return usagef("--outstanding, --duration and --lat-requests must be positive")
			}
			o.Fanouts = fanouts
			var err error
			if o.Kedge, err = sgBenchBinary(cmd); err != nil {
				return err
			}
			res, err := sgbench.Run(cmd.Context(), o, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if err := bench.WriteJSON(filepath.Join(o.Out, "result.json"), res); err != nil {
				return err
			}
			if err := sgbench.WriteCharts(o.Out, res); err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			writeEnvelope(w, "kedge bench sg", res.Envelope)
			fmt.Fprintln(w, res.Placement)
			sgbench.WriteTable(w, res)
			fmt.Fprintf(w, "results in %s (result.json, latency.png/svg, throughput.png/svg)\n", o.Out)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&scenario, "scenario", "fanout", "fanout (kedge against user-space baselines in a two-host lab), loopback (the sgbpf comparison's setup) or tail (stragglers and loss: hedges and retries)")
	f.IntSliceVar(&fanouts, "fanouts", o.Fanouts, "fan-outs (workers per request; loopback: 4,16,64)")
	f.StringVar(&lo.Before, "before", "", "loopback: another kedge `BINARY` (one whose bench sg-client has --type) run as method kedge-before, alternating with this one; tail: its client as kedge-hedged-before / kedge-retry-before, against the same workers")
	f.IntVar(&lo.Rounds, "rounds", lo.Rounds, "loopback, tail: rounds (methods alternate within each)")
	f.IntVar(&lo.StealRetries, "steal-retries", lo.StealRetries, "loopback: run a point of a round again (every method) while one of its runs had over 0.1 CPUs of hypervisor steal, up to this many times")
	f.StringSliceVar(&to.Modes, "modes", to.Modes, "tail: straggle (1% of replies late) and/or loss (1% of requests lost)")
	f.Float64Var(&to.Straggle, "straggle", to.Straggle, "tail: probability that a worker's reply straggles")
	f.DurationVar(&to.StraggleMin, "straggle-min", to.StraggleMin, "tail: shortest straggler delay")
	f.DurationVar(&to.StraggleMax, "straggle-max", to.StraggleMax, "tail: longest straggler delay")
	f.Float64Var(&to.Loss, "loss", to.Loss, "tail: probability that a worker loses a request copy (loss mode)")
	f.Uint64Var(&to.Seed, "seed", to.Seed, "tail: seed of the workers' straggler and loss draws")
	f.DurationVar(&to.LossTimeout, "loss-timeout", to.LossTimeout, "tail: request timeout in loss mode (--timeout: straggle mode, default 200ms there)")
	f.DurationVar(&to.Resend, "resend", to.Resend, "tail: re-send delay, the adaptive delay's ceiling (kedge and user space alike)")
	f.Float64Var(&to.ResendQuantile, "resend-quantile", to.ResendQuantile, "tail: retry at this quantile of reply times (loss mode; 0: at --resend)")
	f.Float64Var(&to.HedgeQuantile, "hedge-quantile", to.HedgeQuantile, "tail: hedge at this quantile of reply times (straggle mode; 0: at --resend)")
	f.DurationVar(&to.ResendMin, "resend-min", to.ResendMin, "tail: the adaptive delay's floor")
	f.IntVar(&to.MaxHedges, "max-hedges", to.MaxHedges, "tail: rounds of hedges per request (straggle mode)")
	f.IntVar(&to.MaxRetries, "max-retries", to.MaxRetries, "tail: rounds of retries per request (loss mode)")
	f.Float64Var(&to.BudgetRatio, "budget-ratio", to.BudgetRatio, "tail: re-sent copies <= ratio x copies + burst")
	f.IntVar(&to.BudgetBurst, "budget-burst", to.BudgetBurst, "tail: the budget's burst (0: max(16, 8 x fan-out), pkg/sg's default)")
	f.StringVar(&o.Type, "type", "int64", "element type of the workers' vectors (loopback: int32)")
	f.IntVar(&o.Elems, "elems", o.Elems, "elements per reply vector (loopback: 256)")
	f.StringSliceVar(&o.Methods, "methods", o.Methods, "methods to run")
	f.IntVar(&o.LatRequests, "lat-requests", o.LatRequests, "unloaded requests per method and fan-out (a third at 1024)")
	f.IntVar(&o.Outstanding, "outstanding", o.Outstanding, "requests in flight in the loaded phase (every method; loopback: 1 and 32 unless given)")
	f.DurationVar(&o.Duration, "duration", o.Duration, "loaded phase per method and fan-out")
	f.DurationVar(&o.Timeout, "timeout", o.Timeout, "request timeout")
	f.StringVar(&o.WorkerCPUs, "worker-cpus", o.WorkerCPUs, "CPUs of the worker process (taskset -c list); the coordinator runs on CPU 0")
	f.IntVar(&o.WorkerThreads, "worker-threads", o.WorkerThreads, "event loops of the worker process (kedge sg worker --threads)")
	f.BoolVar(&o.BridgeNF, "bridge-nf", o.BridgeNF, "keep bridge netfilter (br_netfilter) on in the lab's bridge namespace")
	f.StringVar(&from, "from", "", "print the markdown tables of an earlier run's result.json (`FILE`) instead of running")
	addBenchOutFlag(cmd, &o.Out, "sg")
	return cmd
}

// writeSgFrom prints the tables of docs/benchmarks.md from a result.json of either scenario.
func writeSgFrom(w io.Writer, from string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return fmt.Errorf("read result: %w", err)
	}
	var env bench.Envelope
	if err := json.Unmarshal(b, &env); err != nil {
		return usagef("--from %s: not a result.json: %v", from, err)
	}
	switch env.Schema {
	case sgbench.Schema:
		var res sgbench.Result
		if err := json.Unmarshal(b, &res); err != nil {
			return usagef("--from %s: %v", from, err)
		}
		sgbench.WriteMarkdown(w, &res)
	case sgbench.LoopSchema:
		var res sgbench.LoopResult
		if err := json.Unmarshal(b, &res); err != nil {
			return usagef("--from %s: %v", from, err)
		}
		sgbench.WriteLoopMarkdown(w, &res)
	case sgbench.TailSchema:
		var res sgbench.TailResult
		if err := json.Unmarshal(b, &res); err != nil {
			return usagef("--from %s: %v", from, err)
		}
		sgbench.WriteTailMarkdown(w, &res)
	default:
		return usagef("--from %s: schema %q is not %s, %s or %s", from, env.Schema, sgbench.Schema, sgbench.LoopSchema, sgbench.TailSchema)
	}
	return nil
}

// runBenchSgLoopback is kedge bench sg --scenario loopback: the flags given override its
// defaults (fan-outs, methods, outstanding, type, elements, duration, timeout).
func runBenchSgLoopback(cmd *cobra.Command, lo sgbench.LoopOptions, fanouts []int, o sgbench.Options) error {
	fl := cmd.Flags()
	if fl.Changed("fanouts") {
		lo.Fanouts = fanouts
	}
	if fl.Changed("methods") {
		lo.Methods = o.Methods
	} else if lo.Before != "" {
		lo.Methods = []string{"kedge", "kedge-before"}
	}
	if fl.Changed("outstanding") {
		lo.Outstanding = []int{o.Outstanding}
	}
	if fl.Changed("type") {
		lo.Type = o.Type
	}
	if fl.Changed("elems") {
		lo.Elems = o.Elems
	}
	if fl.Changed("duration") {
		lo.Duration = o.Duration
	}
	if fl.Changed("timeout") {
		lo.Timeout = o.Timeout
	}
	if fl.Changed("lat-requests") {
		lo.Warmup = o.LatRequests
	}
	if !fl.Changed("out") {
		o.Out = lo.Out
	}
	lo.Out = o.Out
	if err := checkFanouts(lo.Fanouts); err != nil {
		return err
	}
	for _, m := range lo.Methods {
		if m == "kedge-before" && lo.Before == "" {
			return usagef("--methods: kedge-before needs --before BINARY")
		}
		if m != "kedge-before" && !slices.Contains(sgbench.LoopMethods, m) {
			return usagef("--methods: unknown method %q (want kedge-before or one of %v)", m, sgbench.LoopMethods)
		}
	}
	if lo.Type != "int32" && lo.Type != "int64" {
		return usagef("--type %q: want int32 or int64", lo.Type)
	}
	if lo.Rounds < 1 || lo.Duration <= 0 || lo.Outstanding[0] < 1 {
		return usagef("--rounds, --duration and --outstanding must be positive")
	}
	if lo.StealRetries < 0 {
		return usagef("--steal-retries must not be negative")
	}
	var err error
	if lo.Kedge, err = sgBenchBinary(cmd); err != nil {
		return err
	}
	res, err := sgbench.RunLoopback(cmd.Context(), lo, cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	if err := bench.WriteJSON(filepath.Join(lo.Out, "result.json"), res); err != nil {
		return err
	}
	if err := sgbench.WriteLoopCharts(lo.Out, res); err != nil {
		return err
	}
	w := cmd.OutOrStdout()
	writeEnvelope(w, "kedge bench sg --scenario loopback", res.Envelope)
	fmt.Fprintln(w, res.Placement)
	sgbench.WriteLoopTable(w, res)
	fmt.Fprintf(w, "results in %s (result.json)\n", lo.Out)
	return nil
}

// sgBenchBinary refuses to run without root and returns this kedge binary, which the
// benchmark runs as its client and worker processes.
func sgBenchBinary(cmd *cobra.Command) (string, error) {
	if err := requireBenchRoot(cmd); err != nil {
		return "", err
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find the kedge binary: %w", err)
	}
	return exe, nil
}

// runBenchSgTail is kedge bench sg --scenario tail: the flags given override its defaults
// (fan-outs, rounds, duration, outstanding, elements, warm-up, timeout, worker CPUs).
func runBenchSgTail(cmd *cobra.Command, to sgbench.TailOptions, rounds int, fanouts []int, o sgbench.Options, before string) error {
	fl := cmd.Flags()
	if fl.Changed("fanouts") {
		to.Fanouts = fanouts
	}
	if fl.Changed("rounds") {
		to.Rounds = rounds
	}
	if fl.Changed("duration") {
		to.Duration = o.Duration
	}
	if fl.Changed("outstanding") {
		to.Outstanding = o.Outstanding
	}
	if fl.Changed("elems") {
		to.Elems = o.Elems
	}
	if fl.Changed("lat-requests") {
		to.Warmup = o.LatRequests
	}
	if fl.Changed("timeout") {
		to.Timeout = o.Timeout
	}
	if fl.Changed("worker-cpus") {
		to.WorkerCPUs = o.WorkerCPUs
	}
	if fl.Changed("out") {
		to.Out = o.Out
	}
	if err := checkTailOptions(to); err != nil {
		return err
	}
	to.Before = before
	var err error
	if to.Kedge, err = sgBenchBinary(cmd); err != nil {
		return err
	}
	res, err := sgbench.RunTail(cmd.Context(), to, cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	if err := bench.WriteJSON(filepath.Join(to.Out, "result.json"), res); err != nil {
		return err
	}
	if err := sgbench.WriteTailCharts(to.Out, res); err != nil {
		return err
	}
	w := cmd.OutOrStdout()
	writeEnvelope(w, "kedge bench sg --scenario tail", res.Envelope)
	fmt.Fprintln(w, res.Placement)
	sgbench.WriteTailTable(w, res)
	fmt.Fprintf(w, "results in %s (result.json, tail-<mode>.png/svg)\n", to.Out)
	return nil
}

// checkFanouts rejects an empty list of fan-outs or one outside 1..1024 (every scenario's
// limit: a group has at most 1024 workers).
func checkFanouts(fanouts []int) error {
	if len(fanouts) == 0 {
		return usagef("--fanouts: at least one")
	}
	for _, f := range fanouts {
		if f < 1 || f > 1024 {
			return usagef("--fanouts: %d is not in 1..1024", f)
		}
	}
	return nil
}

// checkTailOptions rejects tail options that cannot run, saying which flag to change.
func checkTailOptions(to sgbench.TailOptions) error {
	if err := checkFanouts(to.Fanouts); err != nil {
		return err
	}
	if len(to.Modes) == 0 {
		return usagef("--modes: at least one of straggle, loss")
	}
	for _, m := range to.Modes {
		if m != sgbench.ModeStraggle && m != sgbench.ModeLoss {
			return usagef("--modes: unknown mode %q (want straggle or loss)", m)
		}
	}
	switch {
	case to.Rounds < 1 || to.Duration <= 0 || to.Outstanding < 1 || to.Warmup < 0:
		return usagef("--rounds, --duration and --outstanding must be positive, --lat-requests (the warm-up) not negative")
	case to.Straggle < 0 || to.Straggle > 1 || to.Loss < 0 || to.Loss > 1:
		return usagef("--straggle and --loss are probabilities (0..1)")
	case to.StraggleMin <= 0 || to.StraggleMax < to.StraggleMin:
		return usagef("--straggle-min %v, --straggle-max %v: want 0 < min <= max", to.StraggleMin, to.StraggleMax)
	case to.Resend <= 0 || to.Resend >= min(to.Timeout, to.LossTimeout):
		return usagef("--resend %v: want above 0 and below --timeout (%v) and --loss-timeout (%v)", to.Resend, to.Timeout, to.LossTimeout)
	case to.ResendQuantile < 0 || to.ResendQuantile >= 1 || to.HedgeQuantile < 0 || to.HedgeQuantile >= 1 || to.ResendMin < 0 || to.ResendMin > to.Resend:
		return usagef("--resend-quantile %v, --hedge-quantile %v, --resend-min %v: want quantiles in [0, 1) and a floor in [0, --resend]",
			to.ResendQuantile, to.HedgeQuantile, to.ResendMin)
	case to.MaxHedges < 1 || to.MaxHedges > 16 || to.MaxRetries < 1 || to.MaxRetries > 16:
		return usagef("--max-hedges and --max-retries: want 1..16")
	case to.BudgetRatio < 0 || to.BudgetRatio > 100 || to.BudgetBurst < 0:
		return usagef("--budget-ratio %v, --budget-burst %d: want 0..100 and not negative", to.BudgetRatio, to.BudgetBurst)
	}
	return nil
}

// newBenchSgClientCmd is the client process of kedge bench sg (hidden): one method, one
// fan-out, driven over stdin/stdout by the benchmark.
func newBenchSgClientCmd() *cobra.Command {
	var o sgbench.ClientOptions
	var workers, replicas []string
	var nsArg string
	cmd := &cobra.Command{
		Use:    "sg-client",
		Hidden: true,
		Args:   noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ws, err := parseWorkers(workers)
			if err != nil {
				return err
			}
			o.Workers = ws
			if o.Replicas, err = parseWorkers(replicas); err != nil {
				return err
			}
			if len(o.Replicas) > 0 && len(o.Replicas) != len(ws) {
				return usagef("--replicas: %d addresses for %d workers (one second replica per shard)", len(o.Replicas), len(ws))
			}
			ns, err := openNetns(nsArg)
			if err != nil {
				return err
			}
			var res *sgbench.ClientResult
			// Sockets and the group are created in the namespace; the client then stays there.
			err = netnsx.In(ns, func() error {
				res, err = sgbench.RunClient(cmd.Context(), o, os.Stdin, cmd.OutOrStdout())
				return err
			})
			if err != nil {
				return err
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Method, "method", "kedge", "method")
	f.StringVarP(&o.Interface, "interface", "i", "eth0", "interface")
	f.StringSliceVar(&workers, "workers", nil, "workers")
	f.IntVar(&o.Elems, "elems", 4, "vector length")
	f.StringVar(&o.Type, "type", "int64", "element type of the workers' vectors: int32 or int64")
	f.IntVar(&o.LatRequests, "lat-requests", 300, "unloaded requests")
	f.IntVar(&o.Outstanding, "outstanding", 8, "loaded requests in flight")
	f.DurationVar(&o.Duration, "duration", 2*time.Second, "loaded phase")
	f.DurationVar(&o.Timeout, "timeout", 200*time.Millisecond, "request timeout")
	f.StringSliceVar(&replicas, "replicas", nil, "tail methods: every shard's second replica, in worker order")
	f.DurationVar(&o.Resend, "resend", 0, "tail methods: re-send delay (0: off)")
	f.IntVar(&o.MaxResends, "max-resends", 1, "tail methods: rounds of re-sends")
	f.Float64Var(&o.ResendQuantile, "resend-quantile", 0, "tail methods: adaptive delay's quantile (0: fixed)")
	f.DurationVar(&o.ResendMin, "resend-min", 0, "tail methods: adaptive delay's floor")
	f.Float64Var(&o.ResendRatio, "resend-ratio", 0.1, "tail methods: budget ratio")
	f.IntVar(&o.ResendBurst, "resend-burst", 16, "tail methods: budget burst")
	f.BoolVar(&o.KeepLatencies, "keep-latencies", false, "return every loaded request's latency")
	addNetnsFlag(cmd, &nsArg, "run")
	return cmd
}
