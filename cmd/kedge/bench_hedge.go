package main

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/chaos"
	"github.com/kedge-dev/kedge/internal/hedgebench"
)

func init() { registerBench(newBenchHedgeCmd) }

func newBenchHedgeCmd() *cobra.Command {
	var (
		flagOpts  hedgebench.Options // flag values; only the flags given override a scenario's defaults
		rateOpts  hedgebench.RateOptions
		mcOpts    hedgebench.MemcachedOptions
		scenarios string
		out       string
		repeat    int
		merge     []string
		pauses    = hedgebench.DefaultPauses()
	)
	flagOpts.Server = chaos.DefaultConfig()
	cmd := &cobra.Command{
		Use:   "hedge",
		Short: "Reproduce the thesis's Table 4.2: baseline vs app-hedged (Python, Go) vs kernel-hedged",
		Long: `Runs the Deterministic Chaos benchmark in a lab (client and server namespaces on a bridge):
the chaos server and every client are separate processes; the kernel-hedged client is the
baseline client's code run while kedge's hedger is attached to the client's interface.
Prints Table 4.2's columns plus P99.9, hedge excess, extra load and the delay-line backend,
and writes result.json and latency charts (CDF on a log scale, tail zoom; PNG and SVG).

Scenarios:
  thesis    the paper's setting (5000 requests, 2% stalls of 400 ms, 10 ms hedge delay)
  pressure  the same with a spinning process on every core: user-space jitter
  gc        the same while the harness stops every client process (SIGSTOP/SIGCONT) on
            one seeded schedule of 5-50 ms pauses covering 3% of the time, as a Go, JVM
            or Python runtime stops the world: a stopped app hedger cannot send its hedge,
            the kernel's leaves on time. The schedule and each client's pauses are in
            result.json (--pause-seed, --pause-coverage, --pause-min, --pause-max)
  adaptive  kernel hedging at the p95 of recent latencies instead of a fixed delay
  outage    two replicas, the one the clients address in full outage: app hedgers send a
            hedge for every request, kedge's budget (5%, and 50% for contrast) holds the
            extra load (defaults: 1000 requests, 4 loops, 100 ms timeout, no stalls)
  rate      an unmodified UDP client (closed loops, connected sockets) against a server
            that answers at once, at low load (first of --levels) and at saturation (last),
            unhedged, the unhedged path again (control: the bench's own spread), with
            kedge's clone path (--store-limit 0) and with its stored path, paired:
            --repeats short rounds (16), each running every arm in a balanced order (over
            four rounds every arm in every position and after every other arm once),
            at saturation the client pinned to CPU 0 and the servers to CPU 1 in every
            arm. Prints
            req/s ratios, CPU per request added (processes and machine), paired P50 added,
            the targets (docs/hedging.md) beside them, the programs' run time per request
            (BPF_PROG_TEST_RUN) and a 2%-stall service at saturation (missed hedges, lost
            clones). Own schema (kedge.bench.rate/v2) and charts.
  memcached real memcached replicas (srv1, the address the clients use, and srv2) with
            real clients: PHP's pecl memcache (gets over UDP, sets over TCP, 10% sets;
            clients/mcload.php) and memcslap's UDP sets; srv1 stopped on a seeded schedule
            (20-60 ms, 2% of the time); with and without kedge, --repeats rounds in a
            rotated order. Prints ops/s, get latency percentiles and the sets each replica
            counted (memcached's cmd_set: srv2 must count none). Own schema
            (kedge.bench.memcached/v1) and charts. Needs php-cli, php-memcache,
            libmemcached-tools and memcached (scripts/deps.sh installs them).
Flags given explicitly override the scenario's defaults.`,
		Example: `  # the thesis's Table 4.2 (about 2 minutes)
  kedge bench hedge

  # thesis and CPU-pressure scenarios, results under results/hedge/<scenario>/
  kedge bench hedge --scenario thesis,pressure --out results/hedge

  # fast-path cost and throughput: 1 loop and saturation (64 loops), 16 paired rounds
  kedge bench hedge --scenario rate --levels 1,64 --repeats 16

  # 24 rounds over three holds of the benchmark lock, merged into one result
  kedge bench hedge --scenario rate --repeats 8 --out /tmp/hold1   # and /tmp/hold2, /tmp/hold3
  kedge bench hedge --scenario rate --merge /tmp/hold1/rate,/tmp/hold2/rate,/tmp/hold3/rate

  # real memcached replicas, one stopped 2% of the time, gets hedged by kedge
  kedge bench hedge --scenario memcached --repeats 3

  # clients that stop the world, then CPU pressure five times (ranges of P99.9 and MAX)
  kedge bench hedge --scenario gc
  kedge bench hedge --scenario pressure --repeat 5 -n 2000

  # a quick run
  kedge bench hedge -n 1000 --warmup 50`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			list := strings.Split(scenarios, ",")
			if scenarios == "all" {
				list = hedgebench.Scenarios
			}
			for i, s := range list {
				list[i] = strings.TrimSpace(s)
				if err := hedgebench.CheckScenario(list[i]); err != nil {
					return usagef("--scenario: %w", err)
				}
			}
			if err := requireBenchRoot(cmd); err != nil {
				return err
			}
			changed := cmd.Flags().Changed
			// Zero means "the scenario's default" in the options: an explicit zero is a mistake.
			for flag, v := range map[string]int{"requests": flagOpts.N, "concurrency": flagOpts.Concurrency, "repeats": rateOpts.Repeats, "repeat": repeat} {
				if changed(flag) && v < 1 {
					return usagef("--%s %d: must be at least 1", flag, v)
				}
			}
			w := cmd.OutOrStdout()
			if len(merge) > 0 {
				if len(list) != 1 || list[0] != hedgebench.Rate {
					return usagef("--merge: only with --scenario rate")
				}
				res, err := hedgebench.MergeRate(merge, filepath.Join(out, hedgebench.Rate))
				if err != nil {
					return err
				}
				fmt.Fprintf(w, "\n== scenario rate (merged: %s) ==\n", strings.Join(merge, ", "))
				if err := hedgebench.WriteRateReport(w, res); err != nil {
					return err
				}
				fmt.Fprintf(w, "results and charts: %s\n", filepath.Join(out, hedgebench.Rate))
				return nil
			}
			for _, s := range list {
				start := time.Now()
				if s == hedgebench.Rate {
					run := rateOpts
					run.Backend, run.OutDir = flagOpts.Backend, filepath.Join(out, s)
					overlay(changed, map[string]func(){
						"requests": func() { run.N = flagOpts.N }, "warmup": func() { run.Warmup = flagOpts.Warmup },
						"delay": func() { run.Delay = flagOpts.Delay }, "timeout": func() { run.Timeout = flagOpts.Timeout },
						"stall-pct": func() { run.StallPct = flagOpts.Server.StallPct },
						"stall":     func() { run.Stall = flagOpts.Server.Stall },
					})
					res, err := hedgebench.RunRate(cmd.Context(), run)
					if err != nil {
						return benchErr(s, err)
					}
					fmt.Fprintf(w, "\n== scenario rate (%s) ==\n", time.Since(start).Round(time.Second))
					if err := hedgebench.WriteRateReport(w, res); err != nil {
						return err
					}
					fmt.Fprintf(w, "results and charts: %s\n", run.OutDir)
					continue
				}
				if s == hedgebench.Memcached {
					run := mcOpts
					run.Backend, run.OutDir = flagOpts.Backend, filepath.Join(out, s)
					overlay(changed, map[string]func(){
						"requests": func() { run.Ops = flagOpts.N }, "warmup": func() { run.Warmup = flagOpts.Warmup },
						"delay": func() { run.Delay = flagOpts.Delay }, "repeats": func() { run.Rounds = rateOpts.Repeats },
						"concurrency": func() { run.Clients = flagOpts.Concurrency },
					})
					res, err := hedgebench.RunMemcached(cmd.Context(), run)
					if err != nil {
						return benchErr(s, err)
					}
					fmt.Fprintf(w, "\n== scenario memcached (%s) ==\n", time.Since(start).Round(time.Second))
					if err := hedgebench.WriteMemcachedReport(w, res); err != nil {
						return err
					}
					fmt.Fprintf(w, "results and charts: %s\n", run.OutDir)
					continue
				}
				run := hedgebench.Defaults(s)
				run.Backend, run.PyClient, run.OutDir = flagOpts.Backend, flagOpts.PyClient, filepath.Join(out, s)
				overlay(changed, map[string]func(){
					"requests": func() { run.N = flagOpts.N }, "warmup": func() { run.Warmup = flagOpts.Warmup },
					"delay": func() { run.Delay = flagOpts.Delay }, "timeout": func() { run.Timeout = flagOpts.Timeout },
					"concurrency": func() { run.Concurrency = flagOpts.Concurrency },
					"stall-pct":   func() { run.Server.StallPct = flagOpts.Server.StallPct },
					"stall":       func() { run.Server.Stall = flagOpts.Server.Stall },
					"fast":        func() { run.Server.Fast = flagOpts.Server.Fast },
				})
				if s == hedgebench.GC {
					run.Pauses = pauses
				}
				if err := runTableScenario(cmd, run, repeat, start); err != nil {
					return err
				}
			}
			return nil
		},
	}
	d := hedgebench.Defaults(hedgebench.Thesis)
	f := cmd.Flags()
	f.StringVar(&scenarios, "scenario", hedgebench.Thesis, "comma-separated: "+strings.Join(hedgebench.Scenarios, ", ")+", or all")
	addBenchOutFlag(cmd, &out, "hedge") // one subdirectory per scenario
	f.IntVarP(&flagOpts.N, "requests", "n", d.N, "measured requests per client (outage: 1000, rate: 10000 per run, memcached: 30000 operations)")
	f.IntVar(&flagOpts.Warmup, "warmup", d.Warmup, "warm-up requests per client, discarded (outage: 20, rate: 500, memcached: 200)")
	f.DurationVar(&flagOpts.Delay, "delay", d.Delay, "hedge threshold (app and kernel; memcached: 2ms)")
	f.DurationVar(&flagOpts.Timeout, "timeout", d.Timeout, "client timeout (outage: 100ms)")
	f.IntVar(&flagOpts.Concurrency, "concurrency", d.Concurrency, "sequential loops per client (outage: 4; rate: see --levels; memcached: client processes, 4)")
	f.IntVar(&flagOpts.Server.StallPct, "stall-pct", d.Server.StallPct, "percentage of ids that stall (outage: 0)")
	f.DurationVar(&flagOpts.Server.Stall, "stall", d.Server.Stall, "stall duration (rate: 50ms)")
	f.DurationVar(&flagOpts.Server.Fast, "fast", d.Server.Fast, "normal service time (rate: 0, answered at once)")
	f.StringVar(&flagOpts.Backend, "backend", "auto", "delay-line backend: auto, conveyor, netem, edt")
	f.StringVar(&flagOpts.PyClient, "py-client", "", "path to clients/apphedge.py (default: ./clients/apphedge.py)")
	f.IntSliceVar(&rateOpts.Levels, "levels", []int{1, 64}, "rate: concurrent loops per level: the first is the low load, the last saturation")
	f.StringSliceVar(&rateOpts.Arms, "arms", hedgebench.DefaultArms, "rate: arms to run (unhedged always runs); attribution arms: "+strings.Join(hedgebench.AttributionArms, ", "))
	f.IntVar(&rateOpts.SaturationN, "saturation-requests", 0, "rate: measured requests per run at the last level (default: 4 x --requests, 40000)")
	f.IntVar(&rateOpts.Repeats, "repeats", 0, "rate, memcached: rounds, each running every arm (at every level) in a balanced order (rate: 16) or rotated (memcached: 3) per round")
	f.StringVar(&rateOpts.ClientCPUs, "client-cpus", "", "rate: CPU list (taskset -c) of the client at saturation, every arm (default 0 on two CPUs or more)")
	f.StringVar(&rateOpts.ServerCPUs, "server-cpus", "", "rate: CPU list (taskset -c) of the servers at saturation, every arm (default 1 on two CPUs or more)")
	f.BoolVar(&rateOpts.NoPin, "no-pin", false, "rate: leave the client and servers where the scheduler puts them at saturation too")
	f.Uint64Var(&pauses.Seed, "pause-seed", pauses.Seed, "gc: seed of the client pause schedule")
	f.Float64Var(&pauses.Coverage, "pause-coverage", pauses.Coverage, "gc: fraction of the time each client is stopped")
	f.DurationVar(&pauses.Min, "pause-min", pauses.Min, "gc: shortest client pause")
	f.DurationVar(&pauses.Max, "pause-max", pauses.Max, "gc: longest client pause")
	f.StringSliceVar(&merge, "merge", nil, "rate: merge these rate result directories (runs of one binary, split over holds of the lock) into one result, rounds numbered on; runs nothing")
	f.IntVar(&repeat, "repeat", 1, "run each table scenario this many times (run-1/, run-2/, ...) and print the medians")
	return cmd
}

// runTableScenario runs a Table 4.2 scenario repeat times and prints each table; with
// repeat > 1 the runs go to run-1/, run-2/, ... under run.OutDir and the medians follow.
func runTableScenario(cmd *cobra.Command, run hedgebench.Options, repeat int, start time.Time) error {
	w := cmd.OutOrStdout()
	report := bench.ReportOptions{Baseline: "baseline", HedgeDelay: run.Delay,
		IsStall: func(id uint32) bool { return chaos.Stalls(0, id, run.Server.StallPct) }}
	dir := run.OutDir
	var sums [][]bench.Summary
	var results []bench.Result
	for i := 1; i <= repeat; i++ {
		if repeat > 1 {
			run.OutDir = filepath.Join(dir, fmt.Sprintf("run-%d", i))
		}
		res, err := hedgebench.Run(cmd.Context(), run)
		if err != nil {
			return benchErr(run.Scenario, err)
		}
		fmt.Fprintf(w, "\n== scenario %s, run %d/%d (%d requests per client, %s) ==\n",
			run.Scenario, i, repeat, run.N, time.Since(start).Round(time.Second))
		if err := bench.WriteReport(w, res, report); err != nil {
			return err
		}
		if err := hedgebench.WritePauseReport(w, res); err != nil {
			return err
		}
		fmt.Fprintf(w, "results and charts: %s\n", run.OutDir)
		row := make([]bench.Summary, len(res.Series))
		for j, s := range res.Series {
			row[j] = bench.Summarize(s)
		}
		sums = append(sums, row)
		results = append(results, res)
	}
	if repeat == 1 {
		return nil
	}
	med, _, err := bench.MedianSummaries(sums)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "\n== scenario %s: medians over %d runs (%s) ==\n", run.Scenario, repeat, time.Since(start).Round(time.Second))
	if err := bench.WriteTable(w, med, report.Baseline); err != nil {
		return err
	}
	sum, err := hedgebench.SummarizeRepeats(cmd.Context(), run.Scenario, results)
	if err != nil {
		return err
	}
	if err := bench.WriteJSON(filepath.Join(dir, "summary.json"), sum); err != nil {
		return err
	}
	if err := hedgebench.WriteRepeatReport(w, sum); err != nil {
		return err
	}
	fmt.Fprintf(w, "summary: %s\n", filepath.Join(dir, "summary.json"))
	return nil
}

// overlay applies the setters of the flags given on the command line.
func overlay(changed func(string) bool, setters map[string]func()) {
	for flag, set := range setters {
		if changed(flag) {
			set()
		}
	}
}

// benchErr classifies a scenario's error: bad parameters are usage errors (exit 2).
func benchErr(scenario string, err error) error {
	var perr *hedgebench.ParamError
	if errors.As(err, &perr) {
		return usagef("scenario %s: %w", scenario, err)
	}
	return fmt.Errorf("scenario %s: %w", scenario, err)
}
