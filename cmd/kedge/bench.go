package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/chaos"
	"github.com/kedge-dev/kedge/internal/hedgebench"
)

func init() { register(newBenchCmd) }

// benchSubcmds lets other files add `kedge bench <x>` commands from their init().
var benchSubcmds []func() *cobra.Command

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks that run in a kedge lab and write JSON results and charts",
	}
	cmd.AddCommand(newBenchHedgeCmd())
	for _, fn := range benchSubcmds {
		cmd.AddCommand(fn())
	}
	return cmd
}

func newBenchHedgeCmd() *cobra.Command {
	var (
		o         hedgebench.Options
		scenarios string
		out       string
	)
	o.Server = chaos.DefaultConfig()
	cmd := &cobra.Command{
		Use:   "hedge",
		Short: "Reproduce the thesis's Table 4.2: baseline vs app-hedged (Python, Go) vs kernel-hedged",
		Long: `Runs the Deterministic Chaos benchmark in a lab (client and server namespaces on a bridge):
the chaos server and every client are separate processes; the kernel-hedged client is the
baseline client's code run while kedge's hedger is attached to the client's interface.
Prints Table 4.2's columns plus P99.9, hedge excess, extra load and the delay-line backend,
and writes result.json and latency charts (CDF on a log scale, tail zoom; PNG and SVG).

Scenarios: thesis (the paper's setting), pressure (the same with a spinning process on every
core: user-space jitter), adaptive (kernel hedging at the p95 of recent latencies).`,
		Example: `  # the thesis's Table 4.2 (about 2 minutes)
  kedge bench hedge

  # thesis and CPU-pressure scenarios, results under results/hedge/<scenario>/
  kedge bench hedge --scenario thesis,pressure --out results/hedge

  # a quick run
  kedge bench hedge -n 1000 --warmup 50`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if os.Geteuid() != 0 {
				return exitCodeError{exitUnsupported, fmt.Errorf("kedge bench hedge needs root (it creates network namespaces and loads BPF programs)")}
			}
			list := strings.Split(scenarios, ",")
			if scenarios == "all" {
				list = []string{hedgebench.Thesis, hedgebench.Pressure, hedgebench.Adaptive}
			}
			for _, s := range list {
				s = strings.TrimSpace(s)
				run := o
				run.Scenario = s
				run.OutDir = filepath.Join(out, s)
				start := time.Now()
				res, err := hedgebench.Run(cmd.Context(), run)
				if err != nil {
					if strings.Contains(err.Error(), "unknown scenario") {
						return usagef("%w", err)
					}
					return fmt.Errorf("scenario %s: %w", s, err)
				}
				w := cmd.OutOrStdout()
				fmt.Fprintf(w, "\n== scenario %s (%d requests per client, %s, kernel %s, commit %s) ==\n",
					s, run.N, time.Since(start).Round(time.Second), res.Kernel, shortCommit(res.Commit))
				if err := bench.WriteReport(w, res, bench.ReportOptions{
					Baseline: "baseline", HedgeDelay: run.Delay,
					IsStall: func(id uint32) bool { return chaos.Stalls(0, id, run.Server.StallPct) },
				}); err != nil {
					return err
				}
				fmt.Fprintf(w, "results and charts: %s\n", run.OutDir)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&scenarios, "scenario", hedgebench.Thesis, "comma-separated: thesis, pressure, adaptive, or all")
	f.StringVar(&out, "out", filepath.Join("results", "hedge"), "directory for results (one subdirectory per scenario)")
	f.IntVarP(&o.N, "requests", "n", 5000, "measured requests per client")
	f.IntVar(&o.Warmup, "warmup", 200, "warm-up requests per client, discarded")
	f.DurationVar(&o.Delay, "delay", 10*time.Millisecond, "hedge threshold (app and kernel)")
	f.DurationVar(&o.Timeout, "timeout", time.Second, "client timeout")
	f.IntVar(&o.Server.StallPct, "stall-pct", o.Server.StallPct, "percentage of ids that stall")
	f.DurationVar(&o.Server.Stall, "stall", o.Server.Stall, "stall duration")
	f.DurationVar(&o.Server.Fast, "fast", o.Server.Fast, "normal service time")
	f.StringVar(&o.Backend, "backend", "auto", "delay-line backend: auto, conveyor, netem, edt")
	f.StringVar(&o.PyClient, "py-client", "", "path to clients/apphedge.py (default: ./clients/apphedge.py)")
	return cmd
}

func shortCommit(c string) string {
	if len(c) > 12 {
		return c[:12]
	}
	return c
}
