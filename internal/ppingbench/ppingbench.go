// Package ppingbench measures what kedge pping costs on a forwarding path: bulk TCP
// (iperf3) from a sender through a router namespace to a receiver, with the monitor on the
// router's sender-facing interface (a middlebox vantage point, as in ePPing's evaluation)
// or without it, alternating. Per run it records the forwarding rate, the per-packet BPF
// run time of each hook (run-time statistics switched on with the BPF_ENABLE_STATS command
// for the run only), and the RTT samples produced. A fourth run per round measures the XDP
// ingress program (--ingress-hook xdp) the same way. Beside each measured run of kedge's
// programs, a run of empty reference programs on the same hooks (a TC program returning
// TCX_NEXT at ingress and egress, an XDP program returning XDP_PASS) measures the floor:
// what run_time_ns / run_cnt reports for a program that does nothing on this path (the
// hook, the statistics' clock reads, cold caches between packets). Each kedge figure
// minus its floor is the cost of kedge's code.
package ppingbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/netnsx"
	"github.com/kedge-dev/kedge/internal/pping"
)

// Schema names the layout of Result.
const Schema = "kedge.bench.pping/v1"

// Options of a benchmark.
type Options struct {
	Duration  time.Duration // per run
	Rounds    int           // rounds of (off, on, on with statistics)
	RateLimit time.Duration // the monitor's sampling rate limit (-r)
	// Offloads keeps TSO/GSO/GRO on the veths. Off (the default), every packet is
	// MTU-sized, so "per packet" means what it means on a router.
	Offloads bool
	Streams  int    // parallel iperf3 streams
	OutDir   string // result.json goes here ("" : not written)
	// XDP adds a run per round with the XDP ingress program and statistics on.
	XDP bool
	// TCPOnly tracks TCP timestamps only (ePPing's default, -T): ICMP, DNS and QUIC off.
	// Compared with the default (all four), it shows what the other packet sources cost
	// the forwarded TCP packets, which none of them measures. (The kernel source is never
	// on here: it attaches to a cgroup, i.e. the whole host, and is not on the packet path.)
	TCPOnly bool
	// Floor adds, beside each run with statistics, a run of empty reference programs on
	// the same hooks (alternating which of the two goes first from round to round).
	Floor bool
	// Stack adds a run per round with four programs on each TC hook, run one after the
	// other on every packet: an empty program, a minimal monitor, kedge's, an empty
	// program again (stack.go).
	Stack bool
}

// DefaultOptions are 5 s runs, 2 rounds, ePPing's 100 ms rate limit, offloads off, with the
// XDP ingress run and the empty reference programs.
func DefaultOptions() Options {
	return Options{Duration: 5 * time.Second, Rounds: 2, RateLimit: 100 * time.Millisecond, Streams: 1, XDP: true, Floor: true, Stack: true}
}

// sources names the packet sources the monitor tracks (the result's parameter).
func (o Options) sources() string {
	if o.TCPOnly {
		return "tsval"
	}
	return "tsval,icmp,dns,quic"
}

// HookCost is one hook's BPF run time over a run.
type HookCost struct {
	Runs        uint64  `json:"runs"`
	RunTimeNs   uint64  `json:"run_time_ns"`
	NsPerPacket float64 `json:"ns_per_packet"`
}

// RunResult is one measured run.
type RunResult struct {
	Monitor     bool   `json:"monitor"`
	Stats       bool   `json:"stats"`                  // BPF run-time statistics on
	IngressHook string `json:"ingress_hook,omitempty"` // "xdp" for the XDP ingress run (else TC)
	// Program is what ran at the hooks of a run with statistics: "" for kedge's programs,
	// ProgramEmpty for the reference programs that do nothing (the floor).
	Program       string    `json:"program,omitempty"`
	Seconds       float64   `json:"seconds"`
	Packets       uint64    `json:"packets"` // forwarded by the router, both directions
	PPS           float64   `json:"pps"`
	Gbps          float64   `json:"gbps"` // iperf3, at the receiver
	Ingress       *HookCost `json:"ingress,omitempty"`
	Egress        *HookCost `json:"egress,omitempty"`
	Samples       uint64    `json:"samples,omitempty"` // RTT events delivered to user space
	SamplesPerSec float64   `json:"samples_per_sec,omitempty"`
	EventsDropped uint64    `json:"events_dropped,omitempty"`
	// The monitor's non-zero counters per hook over the run (pping counter names): what
	// the packets did, e.g. how many ACKs ended on their headers (match_none) and how many
	// went the full way and found no identifier (match_miss).
	Counters map[string]map[string]uint64 `json:"counters,omitempty"`
	// The stacked run (Program ProgramStack): each program's figures, in the order the
	// hooks ran them, and the empty program run back to back.
	Stack     []StackCost `json:"stack,omitempty"`
	WarmEmpty *WarmCost   `json:"warm_empty,omitempty"`
}

// ProgramEmpty names the reference programs' runs (RunResult.Program).
const ProgramEmpty = "empty"

// Result is a whole benchmark.
type Result struct {
	bench.Envelope
	AttachMode string      `json:"attach_mode"`
	XDPMode    string      `json:"xdp_attach_mode,omitempty"` // the XDP ingress run's attachment
	Runs       []RunResult `json:"runs"`
}

// Summary averages the runs of each kind.
type Summary struct {
	PPSOff, PPSOn, PPSStats       float64 // forwarding rate: no monitor, monitor, monitor + statistics
	GbpsOff, GbpsOn               float64
	ForwardingLossPct             float64 // (off - on) / off
	IngressNs, EgressNs           float64 // BPF run time per packet, weighted by packets
	IngressPackets, EgressPackets uint64
	XDPIngressNs                  float64 // the XDP ingress program, from the XDP runs
	XDPIngressPackets             uint64
	SamplesPerSec                 float64 // over all monitored runs
	// The empty reference programs on the same hooks (0 packets: no such runs).
	Floor Floor
}

// Floor is what the empty reference programs cost per packet, weighted by packets.
type Floor struct {
	IngressNs, EgressNs, XDPIngressNs                float64
	IngressPackets, EgressPackets, XDPIngressPackets uint64
}

// Summarize averages r's runs.
func (r *Result) Summarize() Summary {
	var s Summary
	var nOff, nOn, nStats, nMon float64
	var inNs, egNs, xdpNs, fInNs, fEgNs, fXDPNs uint64
	f := &s.Floor
	for _, run := range r.Runs {
		switch {
		case run.Program == ProgramStack:
			continue
		case run.Program == ProgramEmpty && run.IngressHook == "xdp":
			fXDPNs, f.XDPIngressPackets = fXDPNs+run.Ingress.RunTimeNs, f.XDPIngressPackets+run.Ingress.Runs
		case run.Program == ProgramEmpty:
			fInNs, f.IngressPackets = fInNs+run.Ingress.RunTimeNs, f.IngressPackets+run.Ingress.Runs
			fEgNs, f.EgressPackets = fEgNs+run.Egress.RunTimeNs, f.EgressPackets+run.Egress.Runs
		case run.IngressHook == "xdp":
			xdpNs, s.XDPIngressPackets = xdpNs+run.Ingress.RunTimeNs, s.XDPIngressPackets+run.Ingress.Runs
		case !run.Monitor:
			s.PPSOff, s.GbpsOff, nOff = s.PPSOff+run.PPS, s.GbpsOff+run.Gbps, nOff+1
		case !run.Stats:
			s.PPSOn, s.GbpsOn, nOn = s.PPSOn+run.PPS, s.GbpsOn+run.Gbps, nOn+1
		default:
			s.PPSStats, nStats = s.PPSStats+run.PPS, nStats+1
			inNs, s.IngressPackets = inNs+run.Ingress.RunTimeNs, s.IngressPackets+run.Ingress.Runs
			egNs, s.EgressPackets = egNs+run.Egress.RunTimeNs, s.EgressPackets+run.Egress.Runs
		}
		if run.Monitor && run.IngressHook == "" {
			s.SamplesPerSec, nMon = s.SamplesPerSec+run.SamplesPerSec, nMon+1
		}
	}
	div := func(v *float64, n float64) {
		if n > 0 {
			*v /= n
		}
	}
	div(&s.PPSOff, nOff)
	div(&s.GbpsOff, nOff)
	div(&s.PPSOn, nOn)
	div(&s.GbpsOn, nOn)
	div(&s.PPSStats, nStats)
	div(&s.SamplesPerSec, nMon)
	perPacket := func(ns, pkts uint64) float64 {
		if pkts == 0 {
			return 0
		}
		return float64(ns) / float64(pkts)
	}
	s.IngressNs, s.EgressNs = perPacket(inNs, s.IngressPackets), perPacket(egNs, s.EgressPackets)
	s.XDPIngressNs = perPacket(xdpNs, s.XDPIngressPackets)
	f.IngressNs, f.EgressNs = perPacket(fInNs, f.IngressPackets), perPacket(fEgNs, f.EgressPackets)
	f.XDPIngressNs = perPacket(fXDPNs, f.XDPIngressPackets)
	if s.PPSOff > 0 {
		s.ForwardingLossPct = 100 * (s.PPSOff - s.PPSOn) / s.PPSOff
	}
	return s
}

// WriteTable prints the runs and the summary.
func (r *Result) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "%-9s %8s %10s %8s %12s %12s %12s\n", "MONITOR", "SECONDS", "PPS", "GBIT/S", "INGRESS NS", "EGRESS NS", "SAMPLES/S")
	for _, run := range r.Runs {
		mon, in, eg, sps := "off", "-", "-", "-"
		if run.Monitor {
			mon, sps = "on", strconv.FormatFloat(run.SamplesPerSec, 'f', 1, 64)
		}
		if run.Program == ProgramStack {
			if i := slices.IndexFunc(run.Stack, func(c StackCost) bool { return c.Program == StackKedge }); i >= 0 {
				k := run.Stack[i]
				in, eg = strconv.FormatFloat(k.Ingress.NsPerPacket, 'f', 0, 64), strconv.FormatFloat(k.Egress.NsPerPacket, 'f', 0, 64)
			}
			fmt.Fprintf(w, "%-9s %8.1f %10.0f %8.2f %12s %12s %12s\n", "stack", run.Seconds, run.PPS, run.Gbps, in, eg, strconv.FormatFloat(run.SamplesPerSec, 'f', 1, 64))
			continue
		}
		if run.Stats {
			mon = "on+stats"
			if run.IngressHook == "xdp" {
				mon = "xdp+stats"
			}
			if run.Program == ProgramEmpty {
				mon = map[bool]string{false: "empty", true: "empty-xdp"}[run.IngressHook == "xdp"]
			}
			in = strconv.FormatFloat(run.Ingress.NsPerPacket, 'f', 0, 64)
			eg = strconv.FormatFloat(run.Egress.NsPerPacket, 'f', 0, 64)
		}
		fmt.Fprintf(w, "%-9s %8.1f %10.0f %8.2f %12s %12s %12s\n", mon, run.Seconds, run.PPS, run.Gbps, in, eg, sps)
	}
	s := r.Summarize()
	fmt.Fprintf(w, "\nforwarding %.0f pps without the monitor, %.0f pps with it (%.1f %% lower; %.0f pps with statistics on); %.2f vs %.2f Gbit/s\n",
		s.PPSOff, s.PPSOn, s.ForwardingLossPct, s.PPSStats, s.GbpsOff, s.GbpsOn)
	fmt.Fprintf(w, "BPF run time per packet: ingress %.0f ns (%d packets), egress %.0f ns (%d packets); %.1f RTT samples/s\n",
		s.IngressNs, s.IngressPackets, s.EgressNs, s.EgressPackets, s.SamplesPerSec)
	if s.XDPIngressPackets > 0 {
		fmt.Fprintf(w, "XDP ingress (%s): %.0f ns per packet (%d packets)\n", r.XDPMode, s.XDPIngressNs, s.XDPIngressPackets)
	}
	var egPkts, egNone, egMiss, egRetired uint64
	for _, run := range r.Runs {
		if run.Stats && run.Monitor {
			eg := run.Counters["egress"]
			egPkts, egNone, egMiss = egPkts+eg["pkts"], egNone+eg["match_none"], egMiss+eg["match_miss"]
			egRetired += eg["ts_retired"]
		}
	}
	if egPkts > 0 {
		fmt.Fprintf(w, "egress packets of the runs with statistics: %.1f %% ended on their headers or found nothing outstanding (match_none), %.1f %% went the full way and found no identifier (match_miss); %d identifiers retired by a later echo (ts_retired)\n",
			100*float64(egNone)/float64(egPkts), 100*float64(egMiss)/float64(egPkts), egRetired)
	}
	r.writeStack(w)
	if f := s.Floor; f.IngressPackets > 0 {
		fmt.Fprintf(w, "empty reference programs (the floor): ingress %.0f ns, egress %.0f ns", f.IngressNs, f.EgressNs)
		if f.XDPIngressPackets > 0 {
			fmt.Fprintf(w, ", XDP ingress %.0f ns", f.XDPIngressNs)
		}
		fmt.Fprintf(w, " per packet; kedge above it: ingress %+.0f ns, egress %+.0f ns", s.IngressNs-f.IngressNs, s.EgressNs-f.EgressNs)
		if f.XDPIngressPackets > 0 && s.XDPIngressPackets > 0 {
			fmt.Fprintf(w, ", XDP ingress %+.0f ns", s.XDPIngressNs-f.XDPIngressNs)
		}
		fmt.Fprintln(w)
	}
}

// setup is the prepared lab.
type setup struct {
	lab              *lab.Lab
	sender, receiver *lab.Host
	fwdLinks         []string // router interfaces whose rx counts the forwarded packets
}

// Run runs the benchmark.
func Run(ctx context.Context, o Options) (*Result, error) {
	if o.Duration <= 0 || o.Rounds <= 0 || o.Streams <= 0 {
		return nil, errors.New("run pping benchmark: duration, rounds and streams must be positive")
	}
	l, err := lab.Up(lab.Spec{Name: "ppbench", Fabric: lab.Router, Hosts: []string{"sender", "receiver"}})
	if err != nil {
		return nil, fmt.Errorf("create benchmark lab: %w", err)
	}
	defer l.Close()
	s := &setup{lab: l, sender: l.Host("sender"), receiver: l.Host("receiver"), fwdLinks: []string{"v1", "v2"}}
	if !o.Offloads {
		if err := s.offloadsOff(); err != nil {
			return nil, err
		}
	}
	res := &Result{
		Envelope: bench.NewEnvelope(ctx, Schema, "", map[string]any{
			"duration_s": o.Duration.Seconds(), "rounds": o.Rounds, "rate_limit_ms": float64(o.RateLimit) / 1e6,
			"offloads": o.Offloads, "streams": o.Streams, "traffic": "iperf3 TCP sender -> router -> receiver",
			"monitor_on": "router interface v1 (sender side): ingress sees data, egress sees ACKs",
			"xdp_run":    o.XDP,
			"sources":    o.sources(),
		}),
	}
	if o.Stack {
		res.Parameters["stack"] = "a run per round with, on each TC hook in this order: an empty program, a minimal monitor (headers at fixed offsets, the timestamp option's words, a per-CPU count), kedge's program, an empty program"
	}
	if o.Floor {
		res.Parameters["floor"] = "empty TC programs (TCX_NEXT) at ingress and egress, an empty XDP program (XDP_PASS) in the XDP run"
	}
	for i := range o.Rounds {
		for j, k := range roundRuns(o, i) {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			run, mode, err := s.run(ctx, o, k)
			if err != nil {
				return nil, fmt.Errorf("round %d, run %d: %w", i+1, j+1, err)
			}
			switch {
			case k.empty:
			case k.xdp:
				res.XDPMode = mode
			case mode != "":
				res.AttachMode = mode
			}
			res.Runs = append(res.Runs, run)
		}
	}
	if o.OutDir != "" {
		if err := bench.WriteJSON(filepath.Join(o.OutDir, "result.json"), res); err != nil {
			return nil, err
		}
		if o.Floor {
			if err := res.WriteFloorChart(filepath.Join(o.OutDir, "cost")); err != nil {
				return nil, err
			}
		}
	}
	return res, nil
}

// runKind is one run of a round.
type runKind struct{ monitor, stats, xdp, empty, stack bool }

// roundRuns is round i's runs: off, on, on with statistics, and with o.XDP the XDP ingress
// program with statistics; with o.Floor each run with statistics has the empty programs'
// run beside it on the same hooks, before it in odd rounds and after it in even ones.
func roundRuns(o Options, i int) []runKind {
	runs := []runKind{{}, {monitor: true}}
	pair := func(k runKind) {
		if !o.Floor {
			runs = append(runs, k)
			return
		}
		e := runKind{stats: true, xdp: k.xdp, empty: true}
		if i%2 == 1 {
			runs = append(runs, e, k)
		} else {
			runs = append(runs, k, e)
		}
	}
	pair(runKind{monitor: true, stats: true})
	if o.XDP {
		pair(runKind{monitor: true, stats: true, xdp: true})
	}
	if o.Stack {
		runs = append(runs, runKind{monitor: true, stats: true, stack: true})
	}
	return runs
}

// offloadsOff turns TSO/GSO/GRO off on every interface of the lab (all in its namespaces).
func (s *setup) offloadsOff() error {
	type dev struct {
		ns    *netnsx.Netns
		iface string
	}
	devs := []dev{{s.sender.Netns, s.sender.Iface}, {s.receiver.Netns, s.receiver.Iface}}
	for _, l := range s.fwdLinks {
		devs = append(devs, dev{s.lab.Fabric, l})
	}
	for _, d := range devs {
		if _, err := d.ns.Run("ethtool", "-K", d.iface, "tso", "off", "gso", "off", "gro", "off"); err != nil {
			return fmt.Errorf("turn offloads off on %s in %s: %w", d.iface, d.ns.Name, err)
		}
	}
	return nil
}

// rxPackets sums the router's received packets on the forwarding interfaces.
func (s *setup) rxPackets() (uint64, error) {
	h, err := netlink.NewHandleAt(s.lab.Fabric.Handle)
	if err != nil {
		return 0, fmt.Errorf("open netlink in router: %w", err)
	}
	defer h.Close()
	var n uint64
	for _, name := range s.fwdLinks {
		l, err := h.LinkByName(name)
		if err != nil {
			return 0, fmt.Errorf("find router interface %s: %w", name, err)
		}
		n += l.Attrs().Statistics.RxPackets
	}
	return n, nil
}

// counter is a Sink counting RTT events (nothing is formatted: the cost measured is the
// kernel's and the ring buffer's).
type counter struct{ rtts atomic.Uint64 }

func (c *counter) Event(ev pping.Event) error {
	if _, ok := ev.(*pping.RTTEvent); ok {
		c.rtts.Add(1)
	}
	return nil
}
func (c *counter) Aggregate(*pping.AggReport) error { return nil }

func (s *setup) run(ctx context.Context, o Options, k runKind) (RunResult, string, error) {
	monitor, withStats, xdp := k.monitor, k.stats, k.xdp
	run := RunResult{Monitor: monitor, Stats: withStats}
	if xdp {
		run.IngressHook = "xdp"
	}
	var (
		mon      *pping.Monitor
		sink     counter
		stopMon  = func() error { return nil }
		stats    io.Closer
		progs    [2]*ebpf.Program
		before   [2]*ebpf.ProgramStats
		attached string
		stack    *stackRun
		stack0   [][2]*ebpf.ProgramStats
	)
	if k.stack {
		v1, err := s.routerIfIndex("v1")
		if err != nil {
			return run, "", err
		}
		if stack, err = attachStackFront(s.lab.Fabric.Handle, v1); err != nil {
			return run, "", err
		}
		defer stack.Close()
		run.Program = ProgramStack
	}
	if monitor {
		cfg := pping.DefaultConfig()
		cfg.RateLimit = o.RateLimit
		if o.TCPOnly {
			cfg.ICMP, cfg.DNS, cfg.QUIC = false, false, false
		}
		if xdp {
			cfg.IngressHook = pping.IngressXDP
		}
		var err error
		if mon, err = pping.Load(cfg); err != nil {
			return run, "", err
		}
		defer mon.Close()
		v1, err := s.routerIfIndex("v1")
		if err != nil {
			return run, "", err
		}
		if err := mon.Attach(s.lab.Fabric.Handle, v1, bpfx.TCAuto); err != nil {
			return run, "", err
		}
		attached = mon.AttachMode()
		progs[0], progs[1] = mon.Programs()
		if stack != nil {
			if err := stack.finish(s.lab.Fabric.Handle, v1, progs); err != nil {
				return run, "", err
			}
		}
		mctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- mon.Run(mctx, &sink) }()
		stopMon = func() error { cancel(); return <-done }
		defer func() { _ = stopMon() }() // stopMon is replaced once it has run
	}
	if k.empty {
		run.Program = ProgramEmpty
		v1, err := s.routerIfIndex("v1")
		if err != nil {
			return run, "", err
		}
		ref, err := attachEmpty(s.lab.Fabric.Handle, v1, xdp)
		if err != nil {
			return run, "", err
		}
		defer ref.Close()
		progs, attached = ref.progs, ref.mode
	}
	if withStats {
		// Run-time statistics for this run only; they stop when the fd closes.
		var err error
		if stats, err = ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME)); err != nil {
			return run, "", fmt.Errorf("enable BPF run-time statistics: %w", err)
		}
		defer stats.Close()
		for i, p := range progs {
			if before[i], err = p.Stats(); err != nil {
				return run, "", fmt.Errorf("read program statistics: %w", err)
			}
		}
		if stack != nil {
			if stack0, err = stack.stats(); err != nil {
				return run, "", err
			}
		}
	}

	srv := s.receiver.Command("iperf3", "-s", "-B", s.receiver.IPv4.String())
	if err := s.receiver.Start(srv); err != nil {
		return run, "", fmt.Errorf("start iperf3 server: %w", err)
	}
	defer srv.Wait()
	defer srv.Process.Kill()
	if err := s.waitListening(iperfPort); err != nil {
		return run, "", err
	}

	pkts0, err := s.rxPackets()
	if err != nil {
		return run, "", err
	}
	start := time.Now()
	out, err := s.iperfClient(o)
	if err != nil {
		return run, "", err
	}
	run.Seconds = time.Since(start).Seconds()
	pkts1, err := s.rxPackets()
	if err != nil {
		return run, "", err
	}
	run.Packets = pkts1 - pkts0
	run.PPS = float64(run.Packets) / run.Seconds
	run.Gbps = out / 1e9

	if withStats {
		for i, p := range progs {
			after, err := p.Stats()
			if err != nil {
				return run, "", fmt.Errorf("read program statistics: %w", err)
			}
			cost := hookCost(before[i], after)
			if i == 0 {
				run.Ingress = cost
			} else {
				run.Egress = cost
			}
		}
		if stack != nil {
			stack1, err := stack.stats()
			if err != nil {
				return run, "", err
			}
			run.Stack = stack.costs(stack0, stack1)
			if run.WarmEmpty, err = stack.warmEmpty(); err != nil {
				return run, "", err
			}
		}
	}
	if monitor {
		cnt, err := mon.Counters()
		if err != nil {
			return run, "", err
		}
		if err := stopMon(); err != nil {
			return run, "", err
		}
		stopMon = func() error { return nil }
		run.Samples = sink.rtts.Load()
		run.SamplesPerSec = float64(run.Samples) / run.Seconds
		run.EventsDropped = cnt[pping.HookIngress].EventDropped + cnt[pping.HookEgress].EventDropped
		run.Counters = map[string]map[string]uint64{}
		for _, h := range []pping.Hook{pping.HookIngress, pping.HookEgress} {
			fields, err := pping.CounterFields(&cnt[h])
			if err != nil {
				return run, "", err
			}
			m := map[string]uint64{}
			for _, c := range fields {
				if c.Value != 0 {
					m[c.Name] = c.Value
				}
			}
			run.Counters[h.String()] = m
		}
	}
	return run, attached, nil
}

// emptyRef is the empty reference programs, attached.
type emptyRef struct {
	progs  [2]*ebpf.Program // ingress (TC or XDP), egress (TC)
	attach []bpfx.Attachment
	mode   string
}

// attachEmpty loads and attaches programs that do nothing on the monitor's hooks: at TC
// ingress (or XDP with xdp) and TC egress of ifindex in ns, attached the way the monitor
// attaches its own (TCX when the kernel has it, XDP native before generic). Each is the
// two instructions of a program that returns at once, with the verdict kedge's programs
// return (TCX_NEXT, XDP_PASS).
func attachEmpty(ns netns.NsHandle, ifindex int, xdp bool) (_ *emptyRef, err error) {
	r := &emptyRef{}
	defer func() {
		if err != nil {
			r.Close()
		}
	}()
	load := func(name string, typ ebpf.ProgramType, ret int32) (*ebpf.Program, error) {
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Name: name, Type: typ, License: "Dual BSD/GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, ret), asm.Return()},
		})
		if err != nil {
			return nil, fmt.Errorf("load empty reference program %s: %w", name, err)
		}
		return p, nil
	}
	const xdpPass = 2
	var modes []string
	for i, dir := range []bpfx.Direction{bpfx.Ingress, bpfx.Egress} {
		var a bpfx.Attachment
		if i == 0 && xdp {
			if r.progs[i], err = load("kedge_floor_xdp", ebpf.XDP, xdpPass); err != nil {
				return r, err
			}
			a, err = bpfx.AttachXDP(r.progs[i], ns, ifindex, bpfx.XDPAuto)
		} else {
			if r.progs[i], err = load("kedge_floor_tc", ebpf.SchedCLS, tcxNext); err != nil {
				return r, err
			}
			a, err = bpfx.AttachTC(r.progs[i], bpfx.TCTarget{Netns: ns, IfIndex: ifindex, Dir: dir, Mode: bpfx.TCAuto, Name: "ppbench-floor-" + dir.String()})
		}
		if err != nil {
			return r, fmt.Errorf("attach empty reference program (%s): %w", dir, err)
		}
		r.attach = append(r.attach, a)
		modes = append(modes, a.Mode())
	}
	r.mode = strings.Join(modes, "+")
	return r, nil
}

// Close detaches and unloads the programs.
func (r *emptyRef) Close() error {
	var errs []error
	for i := len(r.attach) - 1; i >= 0; i-- {
		errs = append(errs, r.attach[i].Close())
	}
	for _, p := range r.progs {
		if p != nil {
			errs = append(errs, p.Close())
		}
	}
	return errors.Join(errs...)
}

func hookCost(before, after *ebpf.ProgramStats) *HookCost {
	c := &HookCost{Runs: after.RunCount - before.RunCount, RunTimeNs: uint64(after.Runtime - before.Runtime)}
	if c.Runs > 0 {
		c.NsPerPacket = float64(c.RunTimeNs) / float64(c.Runs)
	}
	return c
}

func (s *setup) routerIfIndex(name string) (int, error) {
	h, err := netlink.NewHandleAt(s.lab.Fabric.Handle)
	if err != nil {
		return 0, fmt.Errorf("open netlink in router: %w", err)
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		return 0, fmt.Errorf("find router interface %s: %w", name, err)
	}
	return l.Attrs().Index, nil
}

const iperfPort = 5201

// waitListening polls (from inside the receiver) until the iperf3 server accepts
// connections. A bare connection that closes at once is an aborted test to iperf3, which
// keeps serving.
func (s *setup) waitListening(port int) error {
	addr := net.JoinHostPort(s.receiver.IPv4.String(), strconv.Itoa(port))
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := s.receiver.Do(func() error {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err == nil {
				c.Close()
			}
			return err
		})
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("iperf3 server on %s: %w", addr, err)
		}
		time.Sleep(20 * time.Millisecond) // polling interval while the server starts
	}
}

// iperfClient runs the bulk transfer and returns the receiver's bits per second. The server
// may still be tearing down waitListening's aborted test when the client connects (it then
// resets the control connection), so a failed start is retried a few times.
func (s *setup) iperfClient(o Options) (float64, error) {
	var err error
	for attempt := 0; attempt < 4; attempt++ {
		var bps float64
		if bps, err = s.iperfClientOnce(o); err == nil {
			return bps, nil
		}
		if !strings.Contains(err.Error(), "control message") && !strings.Contains(err.Error(), "reset by peer") &&
			!strings.Contains(err.Error(), "unable to connect") {
			return 0, err
		}
		time.Sleep(250 * time.Millisecond) // let the server return to listening; nothing to poll
	}
	return 0, err
}

func (s *setup) iperfClientOnce(o Options) (float64, error) {
	secs := strconv.FormatFloat(o.Duration.Seconds(), 'f', 1, 64)
	out, err := s.sender.Run("iperf3", "-c", s.receiver.IPv4.String(), "-p", strconv.Itoa(iperfPort),
		"-t", secs, "-P", strconv.Itoa(o.Streams), "-J")
	var rep struct {
		Error string `json:"error"`
		End   struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if jerr := json.Unmarshal([]byte(out), &rep); jerr != nil {
		return 0, fmt.Errorf("iperf3 client: %w (output not JSON: %v)", err, jerr)
	}
	if rep.Error != "" || err != nil {
		return 0, fmt.Errorf("iperf3 client: %s (%v)", rep.Error, err)
	}
	return rep.End.SumReceived.BitsPerSecond, nil
}
