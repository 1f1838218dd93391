package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/raftbench"
)

func init() { registerBench(newBenchRaftCmd) }

func newBenchRaftCmd() *cobra.Command {
	var (
		o             raftbench.Options
		scenarios     string
		electionTicks string
		tpNodes       string
		out           string
	)
	cmd := &cobra.Command{
		Use:   "raft",
		Short: "Failover time, false elections and write throughput of a kedge raft lab cluster",
		Long: `Runs kedge raft clusters in a lab (node processes in namespaces behind the fault fabric):
  failover         kill -9 of the leader, time until the first write acknowledged through a
                   surviving node (writes retried every 50 ms per attempt); --trials per
                   election timeout; p50/p99/max.
  false-elections  leader changes with no crash, for --fe-duration each: idle, with two
                   busy-looping processes per CPU, and with one follower pinned to a CPU
                   shared with three spinners.
  throughput       --clients closed-loop writers putting to the leader for --tp-duration, for
                   each cluster size in --tp-nodes: writes/s and latency p50/p99.
result.json (envelope: machine, kernel, commit, load) and charts go to --out.`,
		Example: `  sudo kedge bench raft --out docs/results/raft
  sudo kedge bench raft --scenarios failover --trials 50 --election-ticks 5,10,20
  sudo kedge bench raft --scenarios throughput --tp-nodes 3,5 --clients 16 --tp-duration 10s`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Scenarios, err = splitList(scenarios, []string{"failover", "false-elections", "throughput"}); err != nil {
				return err
			}
			if o.ElectionTicks, err = intList("--election-ticks", electionTicks); err != nil {
				return err
			}
			if o.ThroughputNodes, err = intList("--tp-nodes", tpNodes); err != nil {
				return err
			}
			for _, n := range append([]int{o.Nodes}, o.ThroughputNodes...) {
				if n != 3 && n != 5 && n != 7 {
					return usagef("cluster size %d: use 3, 5 or 7", n)
				}
			}
			if o.Trials < 1 || o.Clients < 1 || o.Tick <= 0 {
				return usagef("--trials, --clients and --tick must be positive")
			}
			if err := requireBenchRoot(cmd); err != nil {
				return err
			}
			if o.Binary, err = os.Executable(); err != nil {
				return fmt.Errorf("find the kedge binary: %w", err)
			}
			if o.Dir, err = os.MkdirTemp("", "kedge-bench-raft-"); err != nil {
				return fmt.Errorf("make work directory: %w", err)
			}
			defer os.RemoveAll(o.Dir)
			o.Log = func(format string, args ...any) { fmt.Fprintf(cmd.ErrOrStderr(), format+"\n", args...) }
			ctx, stop := untilDone(cmd.Context(), 0)
			defer stop()
			res, err := raftbench.Run(ctx, o)
			if err != nil {
				return fmt.Errorf("bench raft: %w", err)
			}
			if err := os.MkdirAll(out, 0o755); err != nil {
				return fmt.Errorf("make %s: %w", out, err)
			}
			if err := bench.WriteJSON(filepath.Join(out, "result.json"), res); err != nil {
				return err
			}
			if err := raftbench.WriteCharts(out, res); err != nil {
				return fmt.Errorf("write charts: %w", err)
			}
			w := cmd.OutOrStdout()
			writeEnvelope(w, "bench raft", res.Envelope)
			if err := raftBenchTable(w, res); err != nil {
				return err
			}
			fmt.Fprintf(w, "results in %s\n", out)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&scenarios, "scenarios", "failover,false-elections,throughput", "which runs (comma-separated)")
	f.DurationVar(&o.Tick, "tick", 10*time.Millisecond, "raft tick of the nodes")
	f.StringVar(&electionTicks, "election-ticks", "5,10,20", "election timeouts to measure, in ticks")
	f.IntVar(&o.Nodes, "nodes", 3, "cluster size for failover and false elections")
	f.IntVar(&o.Trials, "trials", 50, "failover trials per election timeout")
	f.DurationVar(&o.FalseElectionDuration, "fe-duration", time.Minute, "length of each false-election run")
	f.StringVar(&tpNodes, "tp-nodes", "3,5", "cluster sizes for the throughput run")
	f.DurationVar(&o.ThroughputDuration, "tp-duration", 10*time.Second, "length of each throughput run")
	f.IntVar(&o.Clients, "clients", 16, "concurrent writers in the throughput run")
	addBenchOutFlag(cmd, &out, "raft")
	return cmd
}

func splitList(s string, allowed []string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if !contains(allowed, p) {
			return nil, usagef("unknown scenario %q: use %s", p, strings.Join(allowed, ", "))
		}
		out = append(out, p)
	}
	return out, nil
}

func intList(flag, s string) ([]int, error) {
	var out []int
	for _, p := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || v < 1 {
			return nil, usagef("%s %q: use comma-separated positive integers", flag, s)
		}
		out = append(out, v)
	}
	return out, nil
}

func raftBenchTable(w io.Writer, r *raftbench.Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if len(r.Failover) > 0 {
		fmt.Fprintln(tw, "FAILOVER\tELECTION TIMEOUT\tTRIALS\tFAILED\tP50\tP99\tMAX")
		for _, f := range r.Failover {
			fmt.Fprintf(tw, "%d nodes\t%.0f ms\t%d\t%d\t%.1f ms\t%.1f ms\t%.1f ms\n", f.Nodes, f.ElectionTimeoutMs, len(f.FailoverMs), f.Failed, f.P50Ms, f.P99Ms, f.MaxMs)
		}
		fmt.Fprintln(tw)
	}
	if len(r.FalseElections) > 0 {
		fmt.Fprintln(tw, "FALSE ELECTIONS\tELECTION TIMEOUT\tDURATION\tLEADER CHANGES\tPER MINUTE\tTERM +")
		for _, f := range r.FalseElections {
			fmt.Fprintf(tw, "%s\t%.0f ms\t%.0f s\t%d\t%.2f\t%d\n", f.Scenario, f.ElectionTimeoutMs, f.DurationS, f.LeaderChanges, f.PerMinute, f.TermIncrease)
		}
		fmt.Fprintln(tw)
	}
	if len(r.Throughput) > 0 {
		fmt.Fprintln(tw, "THROUGHPUT\tCLIENTS\tWRITES/S\tP50\tP99\tMAX\tERRORS")
		for _, t := range r.Throughput {
			fmt.Fprintf(tw, "%d nodes\t%d\t%.0f\t%.2f ms\t%.2f ms\t%.1f ms\t%d\n", t.Nodes, t.Clients, t.PerSecond, t.P50Ms, t.P99Ms, t.MaxMs, t.Errors)
		}
	}
	return tw.Flush()
}
