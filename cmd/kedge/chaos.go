package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/chaos"
)

func init() { register(newChaosCmd) }

func newChaosCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "chaos",
		Short: "Deterministic Chaos benchmark server, clients and report (no BPF needed)",
		Long: `The hedging benchmark of the thesis (chapter 4), usable on its own on loopback or inside
the lab's namespaces: a UDP server whose stalls depend only on the request id (so every
client meets the same slow requests), the baseline and app-hedged clients, and a report
that merges client results into the latency table and CDF charts.

Wire format: each datagram starts with a big-endian uint32 request id; the server echoes it.`,
	}
	cmd.AddCommand(newChaosServeCmd(), newChaosClientCmd(), newChaosReportCmd())
	return cmd
}

func newChaosServeCmd() *cobra.Command {
	cfg := chaos.DefaultConfig()
	var (
		listen   []string
		outage   []int
		duration time.Duration
		output   string
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the Deterministic Chaos UDP server (one or more replicas)",
		Long: `Serve one replica per --listen address. Replica r stalls request id on first sight when
(id + r*stall-pct) mod 100 < stall-pct, so replica 0 follows the thesis (ids ending in 00, 01
with 2%) and no id stalls on two replicas. An id seen at a replica within --ttl is answered
there on the fast path (the replay memory: a hedge lands on a "healthy" instance).
Every request is answered on its own timer, so a stall never delays other requests.
On exit the per-replica counters are logged (or printed as JSON with -o json).`,
		Example: `  # the thesis setting on loopback, for one minute
  kedge chaos serve --listen 127.0.0.1:9999 --duration 1m

  # two replicas, the second in full outage (scenario c)
  kedge chaos serve --listen 127.0.0.1:9999,127.0.0.1:9998 --outage-replica 1

  # two hosts: replica 0 on one, replica 1 (other ids stall) on the other, so a hedge
  # of a request stalled at one is answered fast by the other
  kedge chaos serve --listen 198.18.0.12:9999                   # on host 1
  kedge chaos serve --listen 198.18.0.13:9999 --replica-index 1 # on host 2`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			srv, err := chaos.Listen(cfg, listen)
			if err != nil {
				return usagef("%w", err)
			}
			for _, r := range outage {
				if err := srv.SetOutage(r, true); err != nil {
					srv.Close()
					return usagef("--outage-replica: %w", err)
				}
			}
			for i, a := range srv.Addrs() {
				slog.Info("chaos replica listening", "replica", i, "addr", a, "outage", slices.Contains(outage, i))
			}
			ctx, cancel := untilDone(cmd.Context(), duration)
			defer cancel()
			err = srv.Serve(ctx)
			stats := srv.Stats()
			if output == outputJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if eerr := enc.Encode(stats); eerr != nil {
					return fmt.Errorf("print stats: %w", eerr)
				}
			} else {
				for i, s := range stats {
					slog.Info("chaos replica stats", "replica", i, "addr", s.Addr, "requests", s.Requests,
						"stalls", s.Stalls, "replays", s.Replays, "replays_rescued", s.ReplaysRescued,
						"dropped", s.Dropped, "malformed", s.Malformed, "responses", s.Responses,
						"send_errors", s.SendErrors, "early_rotations", s.EarlyRotations)
				}
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&listen, "listen", []string{"127.0.0.1:9999"}, "replica addresses, comma-separated (replica 0 first)")
	f.IntVar(&cfg.StallPct, "stall-pct", cfg.StallPct, "percentage of ids that stall on first sight at each replica")
	f.DurationVar(&cfg.Stall, "stall", cfg.Stall, "service time of a stalled request")
	f.DurationVar(&cfg.Fast, "fast", cfg.Fast, "service time of every other request")
	f.DurationVar(&cfg.TTL, "ttl", cfg.TTL, "replay memory: an id seen this recently is served fast")
	f.IntSliceVar(&outage, "outage-replica", nil, "replica index(es) in full outage: every request dropped (counted from 0 for the first --listen address)")
	f.IntVar(&cfg.FirstIndex, "replica-index", 0, "replica index of the first --listen address (its stall window): give each host's server its own")
	addDurationFlag(cmd, &duration, "stop")
	addOutputFlag(cmd, &output) // the counters on exit: text (logged) or json (stdout)
	return cmd
}

func newChaosClientCmd() *cobra.Command {
	cfg := chaos.DefaultClientConfig("")
	var (
		mode, name, scenario, out string
		baseID                    uint32
	)
	cmd := &cobra.Command{
		Use:   "client",
		Short: "Run a benchmark client (baseline or app-hedged) and write its latencies as JSON",
		Long: `Send --warmup then -n sequential requests (ids from --base-id upwards), each waiting for
its response up to --timeout, and record each latency and outcome. Modes:
  baseline  send, blocking receive with a deadline; no mitigation. Run it while the kernel
            hedger is attached and it is the kernel-hedged client.
  apphedge  the best user-space hedger: after --delay without an answer send one copy (to
            --alt if given), first answer with the right id wins, late duplicates ignored.
With --concurrency C, C independent loops run at once on disjoint id ranges.
The result (schema kedge.bench/v1, one series) goes to --out; 'kedge chaos report' merges files.`,
		Example: `  kedge chaos client --mode baseline --target 127.0.0.1:9999 --out baseline.json
  kedge chaos client --mode apphedge --target 127.0.0.1:9999 --base-id 1000000 --out app.json
  # with the kernel hedger attached, the baseline client is the kernel-hedged client
  kedge chaos client --mode baseline --connected --name kernel-hedged --out kernel.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			m := chaos.Mode(mode)
			cfg.BaseID = baseID
			if err := cfg.Validate(m); err != nil {
				return usagef("%w", err)
			}
			if out == "" {
				return usagef("--out is required")
			}
			backend, client := "", "go-baseline"
			if m == chaos.ModeAppHedge {
				client, backend = "go-apphedge", "same"
				if cfg.Alt != "" && cfg.Alt != cfg.Target {
					backend = "alt replica"
				}
			}
			if name == "" {
				name = map[chaos.Mode]string{chaos.ModeBaseline: "baseline", chaos.ModeAppHedge: "app-hedged (Go)"}[m]
			}
			ctx, cancel := untilDone(cmd.Context(), 0)
			defer cancel()
			res, err := chaos.RunClient(ctx, m, cfg)
			if err != nil {
				return err
			}
			r := bench.NewResult(ctx, scenario, chaosClientParams(m, cfg))
			r.Series = []bench.Series{res.Series(name, client, backend, m == chaos.ModeAppHedge)}
			if err := r.WriteFile(out); err != nil {
				return err
			}
			return bench.WriteTable(cmd.OutOrStdout(), []bench.Summary{bench.Summarize(r.Series[0])}, "")
		},
	}
	f := cmd.Flags()
	f.StringVar(&mode, "mode", string(chaos.ModeBaseline), "client: baseline or apphedge")
	f.StringVar(&cfg.Target, "target", "127.0.0.1:9999", "server address")
	f.StringVar(&cfg.Alt, "alt", "", "apphedge: send hedges to this replica instead of --target")
	f.BoolVar(&cfg.Connected, "connected", false, "use connect(2)ed sockets instead of sendto/recvfrom")
	f.IntVarP(&cfg.N, "requests", "n", cfg.N, "measured requests")
	f.IntVar(&cfg.Warmup, "warmup", cfg.Warmup, "warm-up requests sent first and discarded")
	f.Uint32Var(&baseID, "base-id", 0, "first request id (use distinct ranges for clients run within --ttl of each other)")
	f.DurationVar(&cfg.Delay, "delay", cfg.Delay, "apphedge: hedge after this long without an answer")
	f.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "give up on a request after this long")
	f.IntVar(&cfg.Concurrency, "concurrency", cfg.Concurrency, "independent sequential loops, disjoint id ranges")
	f.IntVar(&cfg.PayloadLen, "payload", cfg.PayloadLen, "datagram length in bytes (>= 4)")
	f.StringVar(&name, "name", "", "series name in tables and charts (default from --mode)")
	f.StringVar(&scenario, "scenario", "chaos", "scenario name recorded in the result")
	f.StringVar(&out, "out", "", "result file (JSON)")
	return cmd
}

// clientParams records a client configuration in a result file.
func chaosClientParams(m chaos.Mode, c chaos.ClientConfig) map[string]any {
	p := map[string]any{
		"mode": string(m), "target": c.Target, "connected": c.Connected, "n": c.N, "warmup": c.Warmup,
		"base_id": c.BaseID, "timeout_ms": durationMS(c.Timeout), "concurrency": c.Concurrency, "payload_len": c.PayloadLen,
	}
	if m == chaos.ModeAppHedge {
		p["delay_ms"] = durationMS(c.Delay)
		if c.Alt != "" {
			p["alt"] = c.Alt
		}
	}
	return p
}

func durationMS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func newChaosReportCmd() *cobra.Command {
	var (
		baseline, charts, merged string
		stallPct                 int
		delay                    time.Duration
		tailFrom                 float64
	)
	cmd := &cobra.Command{
		Use:   "report RESULT.json...",
		Short: "Merge client results into the latency table (and CDF charts)",
		Long: `Merge result files (one or more series each) and print Table 4.2 of the thesis: P50, P95,
P99, P99.9 and MAX (nearest-rank percentiles, timeouts counted at the time waited), the P99
reduction against --baseline, the extra load of hedging and where hedges went; then per
series the timeouts, late duplicates and the hedge excess (latency of stalled requests minus
--delay minus the median normal latency). With --charts DIR, also write cdf.{png,svg}
(Figure 4.1) and tail.{png,svg} (Figure 4.2) there.`,
		Example: `  kedge chaos report baseline.json app.json py.json --charts results/loopback`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("no result file given (see '%s --help')", cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var rs []bench.Result
			for _, a := range args {
				r, err := bench.ReadFile(a)
				if err != nil {
					return err
				}
				rs = append(rs, r)
			}
			r, err := bench.Merge(rs...)
			if err != nil {
				return usagef("%w", err)
			}
			opt := bench.ReportOptions{Baseline: baseline, HedgeDelay: delay}
			if stallPct > 0 {
				opt.IsStall = func(id uint32) bool { return chaos.Stalls(0, id, stallPct) }
			}
			if err := bench.WriteReport(cmd.OutOrStdout(), r, opt); err != nil {
				return err
			}
			if merged != "" {
				if err := r.WriteFile(merged); err != nil {
					return err
				}
			}
			if charts != "" {
				if err := os.MkdirAll(charts, 0o755); err != nil {
					return fmt.Errorf("create chart directory: %w", err)
				}
				if err := bench.WriteCharts(charts, r, tailFrom, delay); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "charts: %s\n", strings.Join([]string{
					charts + "/cdf.png", charts + "/cdf.svg", charts + "/tail.png", charts + "/tail.svg"}, " "))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&baseline, "baseline", "baseline", "series the P99 reduction is measured against")
	f.IntVar(&stallPct, "stall-pct", 2, "the server's --stall-pct, to find stalled ids (0: no hedge-excess lines)")
	f.DurationVar(&delay, "delay", 10*time.Millisecond, "the hedge delay, for hedge excess and the charts' reference line")
	f.Float64Var(&tailFrom, "tail-from", 0.95, "lowest cumulative fraction of the tail chart")
	f.StringVar(&charts, "charts", "", "directory for the CDF charts (PNG and SVG)")
	f.StringVar(&merged, "merged", "", "also write the merged result here")
	return cmd
}
