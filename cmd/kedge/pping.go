package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/pping"
	"github.com/kedge-dev/kedge/internal/ppingbench"
)

func init() { register(newPpingCmd) }

// ppingFlags are the command line of kedge pping (ePPing's options, kedge's additions).
type ppingFlags struct {
	iface, netnsName, format, rttType, write, metricsAddr, tcMode string
	ingressHook, xdpMode, formatF, cgroup                         string
	rateLimitMS, rttRate, cleanupS                                float64
	aggregateS, prefixV4, prefixV6, maxFlows, aggTimeoutS         int
	includeLocal, includeSYN, aggReverse, tcp, icmp, dns, quic    bool
	debug, counters, hostACKs, kernelRTT                          bool
	kernelRTTSet                                                  bool // --kernel-rtt given explicitly
	services                                                      []string
	quicPorts                                                     []uint
	duration                                                      time.Duration
}

func newPpingCmd() *cobra.Command { return ppingCommand(new(ppingFlags)) }

// ppingCommand is kedge pping with its flags parsed into f.
func ppingCommand(f *ppingFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pping -i IFACE",
		Short: "Passive RTT monitor: TCP timestamps and the kernel's TCP RTTs, ICMP echo, DNS, QUIC's spin bit and UDP request ids, measured in the kernel",
		Long: `kedge pping measures round-trip times of the traffic that crosses an interface, without
sending anything: programs on the interface's egress (TC) and ingress (TC, or XDP with
--ingress-hook xdp) timestamp an identifier when a packet leaves and match its echo when
the reply comes back (ePPing's method). Each sample names its source:

  tsval   TCP TSval -> TSecr            icmp  ICMP/ICMPv6 echo request -> reply
  dns     query -> response (id)        udp   request -> response of a --udp-service
  quic    a spin-bit edge -> the edge it causes (QUIC on --quic-port, 443 by default)
  kernel  the RTT the TCP stack measures for this host's sockets in the interface's
          namespace (a sock_ops program on --cgroup, the cgroup2 root by default; sockets
          opened after the start)

Each flow direction is sampled at most once per --rate-limit (or per --rtt-rate x its RTT).
Output is one line per RTT sample and per flow opening/closing (formats standard, json,
jsonl, ppviz), or with -a a per-subnet summary every interval (packets and bytes arriving
and leaving, per subnet and side of the interface, RTT histogram) kept in the kernel.
Without --netns the interface is looked up in the current network namespace.

Exit codes: 0 done (signal or --duration), 1 runtime error, 2 bad usage (also an interface
or --netns that does not exist), 3 this kernel lacks what the monitor needs (e.g. TCX with
--tc-mode tcx).`,
		Example: `  # RTTs of everything on eth0 of a lab host, for 10 seconds
  sudo kedge pping -i eth0 --netns kedge-lab-demo-client --duration 10s

  # JSON lines to a file (reopened on SIGHUP), every identifier (no rate limit)
  sudo kedge pping -i eth0 --netns kedge-lab-demo-client -F jsonl -r 0 -w /tmp/rtt.jsonl

  # per-/24 and per-/48 histograms every 5 s, plus Prometheus metrics
  sudo kedge pping -i eth0 --netns kedge-lab-demo-router -a 5 --metrics-addr :9464

  # ingress at the XDP hook (native, else generic): earlier timestamps, lower cost
  sudo kedge pping -i eth0 --netns kedge-lab-demo-client --ingress-hook xdp

  # ePPing's spelling works too: format -F, subnets -4/-6, XDP mode -x
  sudo kedge pping -i eth0 --netns kedge-lab-demo-router -F json -a 5 -4 16 -I xdp -x native

  # a UDP service whose 4-byte request id starts the payload (as kedge hedge describes it)
  sudo kedge pping -i eth0 --netns kedge-lab-demo-client --udp-service 9999:0:4

  # QUIC on 443 and 8443 only (its spin bit); the kernel's RTTs of the sockets of one cgroup
  sudo kedge pping -i eth0 --quic --quic-port 443 --quic-port 8443
  sudo kedge pping -i eth0 --cgroup /sys/fs/cgroup/system.slice/nginx.service`,
		Args: func(cmd *cobra.Command, args []string) error {
			if err := f.checkFormatF(); err != nil { // ePPing's -f took the next flag as its value
				return err
			}
			return noArgs(cmd, args)
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.kernelRTTSet = cmd.Flags().Changed("kernel-rtt")
			cfg, format, err := f.config()
			if err != nil {
				return err
			}
			return runPping(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), *f, cfg, format)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.iface, "interface", "i", "", "interface to monitor (required)")
	addNetnsFlag(cmd, &f.netnsName, "the interface is")
	fl.Float64VarP(&f.rateLimitMS, "rate-limit", "r", 100, "minimum `ms` between two samples of a flow direction (0: every identifier)")
	fl.Float64VarP(&f.rttRate, "rtt-rate", "R", 0, "sample at most once per this many RTTs of the flow (overrides -r once an RTT is known)")
	fl.StringVarP(&f.rttType, "rtt-type", "t", "min", "RTT that -R refers to: min or smoothed")
	fl.StringVarP(&f.format, "format", "F", "standard", "output format: standard, json, jsonl or ppviz")
	// -f was kedge's shorthand of --format before it took ePPing's -F; it still is (ePPing's
	// -f/--force has no counterpart, see docs/pping.md).
	fl.StringVarP(&f.formatF, "format-f", "f", "", "--format (kedge's earlier shorthand)")
	_ = fl.MarkHidden("format-f")
	fl.BoolVarP(&f.includeLocal, "include-local", "l", false, "also measure flows to this host seen at ingress (host-side delays)")
	fl.BoolVarP(&f.includeSYN, "include-syn", "s", false, "start TCP flows at the SYN (may fill the flow table with half-open connections)")
	fl.BoolVar(&f.includeSYN, "include-SYN", false, "--include-syn (ePPing's spelling)")
	_ = fl.MarkHidden("include-SYN")
	fl.BoolVar(&f.hostACKs, "host-acks", true, "time the pure ACKs this host's sockets send, so a host receiving data (a download) sees its flows' RTTs (ePPing: never)")
	fl.BoolVarP(&f.tcp, "tcp", "T", false, "track TCP (timestamps option; with --kernel-rtt, the kernel's RTTs)")
	fl.BoolVarP(&f.icmp, "icmp", "C", false, "track ICMP and ICMPv6 echo")
	fl.BoolVar(&f.dns, "dns", false, "track DNS over UDP port 53")
	fl.BoolVar(&f.quic, "quic", false, "track QUIC's spin bit on the --quic-port ports (no -T/-C/--dns/--quic: all four)")
	fl.UintSliceVar(&f.quicPorts, "quic-port", []uint{pping.DefaultQUICPort}, "UDP `PORT` whose traffic is QUIC (repeatable, up to 8)")
	fl.BoolVar(&f.kernelRTT, "kernel-rtt", true, "with TCP: also report the RTTs the kernel measures for this host's sockets in the interface's namespace (a sock_ops program on --cgroup)")
	fl.StringVar(&f.cgroup, "cgroup", "", "cgroup2 `DIR` whose processes' sockets --kernel-rtt sees (default: the cgroup2 root, every process)")
	fl.StringArrayVar(&f.services, "udp-service", nil, "track a UDP service: `PORT:OFFSET:LEN[:le|be]` of its request id (repeatable)")
	fl.IntVarP(&f.aggregateS, "aggregate", "a", 0, "report per-subnet RTT histograms every `SECONDS` instead of every sample")
	fl.IntVarP(&f.prefixV4, "aggregate-subnets-v4", "4", 24, "IPv4 prefix length of aggregation subnets (0-32)")
	fl.IntVarP(&f.prefixV6, "aggregate-subnets-v6", "6", 48, "IPv6 prefix length of aggregation subnets (0-64)")
	fl.IntVar(&f.aggTimeoutS, "aggregate-timeout", 30, "drop a subnet from the Prometheus series after `SECONDS` without traffic (0: never)")
	fl.BoolVar(&f.aggReverse, "aggregate-reverse", false, "aggregate by the reply's destination instead of its source")
	fl.Float64VarP(&f.cleanupS, "cleanup-interval", "c", 1, "`seconds` between garbage-collection runs (0: never)")
	fl.StringVarP(&f.write, "write", "w", "", "write to `FILE` (appended; reopened on SIGHUP) instead of stdout")
	addDurationFlag(cmd, &f.duration, "stop")
	addMetricsFlag(cmd, &f.metricsAddr)
	fl.IntVar(&f.maxFlows, "max-flows", pping.DefaultMaxFlows, "flow table size (the timestamp table holds twice as many)")
	fl.StringVar(&f.tcMode, "tc-mode", "auto", "TC attachment: auto (TCX, else clsact), tcx or clsact")
	fl.StringVarP(&f.ingressHook, "ingress-hook", "I", "tc", "ingress program: tc, or xdp (native, else generic XDP; egress stays TC)")
	fl.StringVarP(&f.xdpMode, "xdp-mode", "x", "unspecified", "with -I xdp: unspecified (native, else generic), native or generic")
	fl.BoolVar(&f.debug, "debug", false, "bpf_printk traces (read /sys/kernel/tracing/trace_pipe)")
	fl.BoolVar(&f.counters, "counters", false, "print the per-hook packet counters to stderr on exit")
	return cmd
}

// config turns the flags into a monitor configuration and an output format.
func (f ppingFlags) config() (pping.Config, pping.Format, error) {
	cfg := pping.DefaultConfig()
	if f.iface == "" {
		return cfg, 0, usagef("kedge pping needs an interface: -i IFACE (see 'kedge pping --help')")
	}
	if err := f.checkFormatF(); err != nil {
		return cfg, 0, err
	}
	if f.formatF != "" {
		f.format = f.formatF
	}
	format, err := pping.ParseFormat(f.format)
	if err != nil {
		return cfg, 0, usagef("%v", err)
	}
	switch f.rttType {
	case "min":
	case "smoothed":
		cfg.UseSRTT = true
	default:
		return cfg, 0, usagef("--rtt-type must be min or smoothed, not %q", f.rttType)
	}
	if cfg.IngressHook, err = pping.ParseIngressHook(f.ingressHook); err != nil {
		return cfg, 0, usagef("--ingress-hook: %v", err)
	}
	switch f.xdpMode {
	case "unspecified":
	case "native":
		cfg.XDPMode = bpfx.XDPNative
	case "generic":
		cfg.XDPMode = bpfx.XDPGeneric
	default:
		return cfg, 0, usagef("--xdp-mode must be unspecified, native or generic, not %q", f.xdpMode)
	}
	if f.tcp || f.icmp || f.dns || f.quic {
		cfg.TCP, cfg.ICMP, cfg.DNS, cfg.QUIC = f.tcp, f.icmp, f.dns, f.quic
	}
	cfg.QUICPorts = nil
	for _, p := range f.quicPorts {
		if p == 0 || p > 65535 {
			return cfg, 0, usagef("--quic-port %d: use a port from 1 to 65535", p)
		}
		cfg.QUICPorts = append(cfg.QUICPorts, uint16(p))
	}
	cfg.KernelRTT = cfg.TCP && f.kernelRTT
	cfg.Cgroup = f.cgroup
	if f.kernelRTTSet && f.kernelRTT && !cfg.TCP {
		return cfg, 0, usagef("--kernel-rtt measures TCP sockets: track TCP too (-T) or leave --kernel-rtt out")
	}
	for _, s := range f.services {
		svc, err := pping.ParseService(s)
		if err != nil {
			return cfg, 0, usagef("--udp-service: %v", err)
		}
		cfg.Services = append(cfg.Services, svc)
	}
	for _, v := range []struct {
		flag  string
		value float64
	}{{"--rate-limit", f.rateLimitMS}, {"--cleanup-interval", f.cleanupS}, {"--aggregate", float64(f.aggregateS)},
		{"--aggregate-timeout", float64(f.aggTimeoutS)}} {
		if v.value < 0 {
			return cfg, 0, usagef("%s must not be negative, got %v", v.flag, v.value)
		}
	}
	cfg.RateLimit = time.Duration(f.rateLimitMS * float64(time.Millisecond))
	cfg.RTTRate = f.rttRate
	cfg.IncludeLocal, cfg.IncludeSYN, cfg.HostACKs = f.includeLocal, f.includeSYN, f.hostACKs
	cfg.AggTimeout = time.Duration(f.aggTimeoutS) * time.Second
	cfg.Aggregate = time.Duration(f.aggregateS) * time.Second
	cfg.AggPrefixV4, cfg.AggPrefixV6, cfg.AggByDst = f.prefixV4, f.prefixV6, f.aggReverse
	cfg.CleanupInterval = time.Duration(f.cleanupS * float64(time.Second))
	cfg.MaxFlows = f.maxFlows
	cfg.Debug = f.debug
	if err := cfg.Validate(); err != nil {
		return cfg, 0, usagef("%v", err)
	}
	return cfg, format, nil
}

// checkFormatF catches ePPing's -f (--force, no value), which kedge's -f (--format) reads
// the next argument as the value of.
func (f ppingFlags) checkFormatF() error {
	if strings.HasPrefix(f.formatF, "-") {
		return usagef("-f is kedge's --format (ePPing's is -F) and wants a format, not %q; ePPing's -f/--force has no counterpart: kedge never replaces or removes programs it did not attach", f.formatF)
	}
	return nil
}

func parseTCMode(s string) (bpfx.TCMode, error) {
	for _, m := range []bpfx.TCMode{bpfx.TCAuto, bpfx.TCX, bpfx.TCClsact} {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, usagef("--tc-mode must be auto, tcx or clsact, not %q", s)
}

func runPping(ctx context.Context, stdout, stderr io.Writer, f ppingFlags, cfg pping.Config, format pping.Format) error {
	mode, err := parseTCMode(f.tcMode)
	if err != nil {
		return err
	}
	var out *pping.Writer
	if f.write != "" {
		if out, err = pping.NewFileWriter(f.write, format); err != nil {
			// A path that cannot be written is a flag value that cannot be used (exit 2).
			return usagef("-w %s: %w (give a file in a writable directory)", f.write, err)
		}
	} else {
		out = pping.NewWriter(stdout, format)
	}
	defer out.Close()

	target, err := openRunTarget(f.metricsAddr, f.netnsName, f.iface)
	if err != nil {
		return err
	}
	defer target.Close()
	var kernelNote string
	if cfg.KernelRTT {
		// On by default: where it cannot run (an old kernel, no cgroup2 hierarchy), the
		// monitor runs without it and says why; asked for explicitly, that is an error.
		if _, err := pping.KernelRTTPreflight(cfg.Cgroup); err != nil {
			if f.kernelRTTSet {
				return err
			}
			cfg.KernelRTT = false
			kernelNote = fmt.Sprintf("not the kernel's RTTs (%v)", err)
		}
	}
	m, err := pping.Load(cfg)
	if err != nil {
		return rootHint(err)
	}
	defer m.Close()
	if err := m.Attach(target.ns, target.ifindex, mode); err != nil {
		return rootHint(err)
	}
	slog.Debug("pping attached", "interface", f.iface, "netns", f.netnsName, "mode", m.AttachMode())
	fmt.Fprintln(stderr, startNotice(f.iface, m.AttachMode(), cfg, m.KernelRTTCgroupPath(), kernelNote))

	ctx, stop := untilDone(ctx, f.duration)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				if err := out.Reopen(); err != nil {
					slog.Error("pping: reopen output", "err", err)
				}
			}
		}
	}()

	var sink pping.Sink = out
	if target.metrics != nil {
		mt := pping.NewMetrics(m, out)
		target.metrics.Serve(mt.Registry())
		sink = mt
	}
	runErr := m.Run(ctx, sink)
	if f.counters {
		if err := writeCounters(stderr, m); err != nil {
			runErr = errors.Join(runErr, err)
		}
	}
	return runErr
}

// startNotice says on stderr, when the monitor starts, what it measures and what it leaves
// out by default, with the flag that changes it: a user on an endpoint should not have to
// read the counters to learn why a flow has no samples.
func startNotice(iface, mode string, cfg pping.Config, cgroup, kernelNote string) string {
	var what []string
	quic := "QUIC's spin bit on UDP " + strings.Trim(strings.Join(strings.Fields(fmt.Sprint(cfg.QUICPorts)), ","), "[]")
	for _, p := range []struct {
		on   bool
		name string
	}{{cfg.TCP, "TCP"}, {cfg.ICMP, "ICMP"}, {cfg.DNS, "DNS"}, {cfg.QUIC, quic}, {len(cfg.Services) > 0, "UDP services"}} {
		if p.on {
			what = append(what, p.name)
		}
	}
	var notes []string
	switch {
	case cfg.KernelRTT:
		notes = append(notes, fmt.Sprintf("the kernel's RTTs of the TCP sockets opened from now on in this namespace by the processes of cgroup %s (--kernel-rtt=false: not)", cgroup))
	case kernelNote != "":
		notes = append(notes, kernelNote)
	case cfg.TCP:
		notes = append(notes, "not the kernel's RTTs (--kernel-rtt: include them)")
	}
	if cfg.HostACKs {
		notes = append(notes, "this host's own TCP flows through its pure ACKs too (--host-acks=false: not)")
	} else {
		notes = append(notes, "not this host's pure ACKs, so no samples for data it receives (--host-acks: time them)")
	}
	if cfg.IncludeLocal {
		notes = append(notes, "also the time this host takes to answer (-l)")
	} else {
		notes = append(notes, "not the time this host takes to answer what it receives (-l: include it)")
	}
	if !cfg.IncludeSYN {
		notes = append(notes, "TCP from the first data packet (-s: from the SYN)")
	}
	if cfg.RTTRate > 0 {
		notes = append(notes, fmt.Sprintf("at most one sample per %g RTTs per flow direction (-R)", cfg.RTTRate))
	} else if cfg.RateLimit > 0 {
		notes = append(notes, fmt.Sprintf("at most one sample per %v per flow direction (-r)", cfg.RateLimit))
	}
	return fmt.Sprintf("kedge pping: %s (%s): timing %s; %s", iface, mode, strings.Join(what, ", "), strings.Join(notes, "; "))
}

// writeCounters prints the non-zero counters of each hook.
func writeCounters(w io.Writer, m *pping.Monitor) error {
	all, err := m.Counters()
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOOK\tCOUNTER\tVALUE")
	for _, h := range pping.Hooks {
		fields, err := pping.CounterFields(&all[h])
		if err != nil {
			return err
		}
		for _, c := range fields {
			if c.Value != 0 {
				fmt.Fprintf(tw, "%s\t%s\t%d\n", h, c.Name, c.Value)
			}
		}
	}
	return tw.Flush()
}

func init() { registerBench(newBenchPpingCmd) }

func newBenchPpingCmd() *cobra.Command {
	o := ppingbench.DefaultOptions()
	var out string
	cmd := &cobra.Command{
		Use:   "pping",
		Short: "Cost of kedge pping on a forwarding path: BPF ns per packet, forwarding rate on vs off, samples/s",
		Long: `Runs bulk TCP (iperf3) from a sender through a router namespace to a receiver, with kedge
pping on the router's sender-side interface (ingress sees the data, egress the ACKs) or
not. Each round is three runs: monitor off, on, and on with BPF run-time statistics
switched on through the BPF_ENABLE_STATS command for that run only (never the global
sysctl), giving run_time_ns / run_cnt per hook; forwarding rates compare the first two. A
fourth run (--xdp, on by default) measures the XDP ingress program the same way. Beside
each run with statistics, a run of empty reference programs on the same hooks (--floor, on
by default: TC programs returning TCX_NEXT, an XDP program returning XDP_PASS) measures
what the hook and the statistics cost a program that does nothing; its turn alternates
with kedge's from round to round. kedge's figure minus the floor is its code's cost. A
last run per round (--stack, on by default) puts four programs on each TC hook, timed on
the same packets: an empty one, a minimal monitor, kedge's, an empty one again; and runs
an empty program and one that reads the clock back to back (BPF_PROG_TEST_RUN) to show
what the statistics' own clock reads cost.
With offloads off (the default) every packet is MTU-sized.`,
		Example: `  # two rounds of 5 s runs, results in results/pping/result.json
  sudo kedge bench pping

  # every identifier sampled (no rate limit), longer runs
  sudo kedge bench pping --rate-limit 0 --duration 10s --rounds 3`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Duration <= 0 || o.Rounds <= 0 || o.Streams <= 0 || o.RateLimit < 0 {
				return usagef("--duration, --rounds and --streams must be positive, --rate-limit not negative")
			}
			if err := requireBenchRoot(cmd); err != nil {
				return err
			}
			o.OutDir = out
			res, err := ppingbench.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			writeEnvelope(w, "attach "+res.AttachMode, res.Envelope)
			res.WriteTable(w)
			if out != "" {
				fmt.Fprintf(w, "result: %s\n", filepath.Join(out, "result.json"))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&o.Duration, "duration", o.Duration, "length of each run")
	f.IntVar(&o.Rounds, "rounds", o.Rounds, "rounds of three runs: off, on, on with statistics (and the XDP run)")
	f.BoolVar(&o.XDP, "xdp", o.XDP, "add a run per round with the XDP ingress program (--ingress-hook xdp), statistics on")
	f.BoolVar(&o.Floor, "floor", o.Floor, "add a run of empty reference programs on the same hooks beside each run with statistics (the floor)")
	f.BoolVar(&o.Stack, "stack", o.Stack, "add a run per round with an empty program, a minimal monitor, kedge's program and an empty program again on each TC hook, timed on the same packets")
	f.DurationVar(&o.RateLimit, "rate-limit", o.RateLimit, "the monitor's per-flow sampling interval (0: every identifier)")
	f.BoolVar(&o.Offloads, "offloads", o.Offloads, "keep TSO/GSO/GRO on (per-packet figures then count super-packets)")
	f.IntVar(&o.Streams, "streams", o.Streams, "parallel TCP streams")
	f.BoolVar(&o.TCPOnly, "tcp-only", o.TCPOnly, "track TCP timestamps only (ePPing's default): ICMP, DNS and QUIC off, to see what they cost TCP packets")
	addBenchOutFlag(cmd, &out, "pping")
	return cmd
}
