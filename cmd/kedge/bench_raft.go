package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kedge-dev/kedge/internal/bench"
	"github.com/kedge-dev/kedge/internal/raftbench"
	"github.com/kedge-dev/kedge/internal/raftlab"
)

func init() {
	registerBench(newBenchRaftCmd)
	registerBench(newBenchRaftProbeCmd)
}

// newBenchRaftProbeCmd is the heartbeat round-trip probe `kedge bench raft` starts in a lab
// leader's namespace (raftbench.Probe); hidden: not for direct use.
func newBenchRaftProbeCmd() *cobra.Command {
	var (
		p        raftbench.Probe
		from, to string
	)
	cmd := &cobra.Command{
		Use:    "raft-hbprobe",
		Short:  "Heartbeat round-trip probe (started by kedge bench raft in a lab leader's namespace)",
		Hidden: true,
		Args:   noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if p.From, err = netip.ParseAddrPort(from); err != nil {
				return usagef("--from %q: want ip:port", from)
			}
			if p.To, err = netip.ParseAddrPort(to); err != nil {
				return usagef("--to %q: want ip:port", to)
			}
			rtts, lost, err := p.Run()
			if err != nil {
				return err
			}
			return json.NewEncoder(cmd.OutOrStdout()).Encode(raftbench.ProbeResult{RTTUs: rtts, Lost: lost})
		},
	}
	f := cmd.Flags()
	f.Uint64Var(&p.Cluster, "cluster", 0, "cluster id")
	f.Uint64Var(&p.Leader, "leader", 0, "the leader's id (the probe speaks in its name)")
	f.Uint64Var(&p.Follower, "follower", 0, "the follower probed")
	f.Uint64Var(&p.Term, "term", 0, "the leader's current term")
	f.StringVar(&from, "from", "", "the leader's raft address (ip:port)")
	f.StringVar(&to, "to", "", "the follower's raft address (ip:port)")
	f.IntVar(&p.Count, "count", 20, "probes")
	f.DurationVar(&p.Interval, "interval", 5*time.Millisecond, "pause between probes")
	f.DurationVar(&p.Timeout, "timeout", 100*time.Millisecond, "wait for each answer")
	return cmd
}

func newBenchRaftCmd() *cobra.Command {
	var (
		o             raftbench.Options
		scenarios     string
		electionTicks string
		tpNodes       string
		modes         string
		phases        string
		feModes       string
		peer          string
		routings      string
		clients       string
		auth          bool
		out           string
	)
	cmd := &cobra.Command{
		Use:   "raft",
		Short: "Failover time, false elections, write throughput and CPU per heartbeat of kedge raft (kernel paths on vs off) and of etcd",
		Long: `Runs kedge raft clusters in a lab (node processes in namespaces behind the fault fabric, data
on the same disk with fsync), one cluster per --offload mode: "on" (the kernel paths:
heartbeats and pre-votes answered in XDP, leader failure detected in the kernel; asked for
explicitly, so a kernel that cannot run them fails the run) and "off" (--offload=false, user
space only). With --peer etcd an etcd cluster (Debian's etcd-server, apt-get install
etcd-server) runs in the same kind of lab beside them, written to by etcd's own Go client,
and is the baseline of every ratio. The clusters run at the same time and the trials and
rounds alternate, so every system sees the same machine - except the failover, which with
etcd among the modes runs in blocks (--failover-block): one system's cluster up at a time.
  failover         kill -9 of the leader, time until the first write acknowledged through a
                   surviving node, per --failover-client: told which node died (leader,
                   retry) or not told (uninformed: it writes to the leader it knew and finds
                   out as an application's client does); --trials per election timeout,
                   mode and client, alternating; p50/p99/max.
  false-elections  leader changes with no crash, for --fe-duration per phase (--fe-phases):
                   idle; spinners (two busy loops per CPU); starved-follower (one follower
                   pinned to a CPU shared with three spinners); stress (one spinner per CPU
                   AND a starved follower); stress-disk (stress, AND the other follower's
                   disk stalled: its writes limited to --fe-stall-iops a second, so each
                   fsync takes hundreds of ms, while 4 writers put to the leader; with this
                   phase every node of every system has a disk of its own, ext4 on a loop
                   device, so the stall is the stalled node's alone). Every
                   mode's cluster under the same pressure at once. The shortest quiet timeout per mode is the shortest of
                   --election-ticks with no leader change (a search wants --fe-duration 10m).
  throughput       --clients closed-loop writers of 64-byte values over 1000 keys, per
                   cluster size in --tp-nodes and routing in --tp-routing (every request to
                   the leader, or spread over all nodes as etcd's client balances): one
                   cluster per mode, built once; --tp-rounds rounds, each running every mode
                   for --tp-duration in turn (the order reversed every other round) while
                   the other clusters idle; with --tp-concurrent every mode's writers run at
                   the same time. Per run writes/s, latency p50/p99, CPU per write; per
                   round each mode's ratio to the baseline (etcd, else off); the median
                   ratio, its min-max and a sign test over the rounds.
  heartbeat        kedge's modes idle for --hb-duration: the CPU time of one follower's
                   process per heartbeat that reached it (with offload on, most are answered
                   in XDP); then --hb-probes heartbeats sent in the leader's name from its
                   namespace time the follower's round trip (these clusters have no key: the
                   probe cannot sign).
With --auth (default) every kedge cluster gets a random key: all UDP packets carry a MAC.
result.json (envelope: machine, kernel, commit, load) and charts go to --out.`,
		Example: `  sudo kedge bench raft --out docs/results/raft
  sudo kedge bench raft --scenarios failover --trials 50 --election-ticks 3,10
  sudo kedge bench raft --scenarios false-elections --election-ticks 3 --fe-duration 10m
  sudo kedge bench raft --scenarios throughput --tp-nodes 3 --clients 16 --tp-rounds 6 --tp-duration 20s --offload on,off
  sudo kedge bench raft --scenarios throughput --tp-concurrent --tp-rounds 6 --tp-duration 20s --offload on,off
  sudo kedge bench raft --peer etcd --scenarios throughput --offload on --tp-routing leader,spread --tp-rounds 4 --tp-duration 20s
  sudo kedge bench raft --peer etcd --scenarios failover --offload on --tick 1ms --election-ticks 10,50 --failover-client leader,uninformed --trials 20`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Scenarios, err = splitList("scenario", scenarios, []string{"failover", "false-elections", "throughput", "heartbeat"}); err != nil {
				return err
			}
			if o.Modes, err = splitList("--offload mode", modes, raftbench.Modes); err != nil {
				return err
			}
			switch peer {
			case "":
			case raftbench.ModeEtcd:
				if !contains(o.Modes, raftbench.ModeEtcd) {
					o.Modes = append(o.Modes, raftbench.ModeEtcd)
				}
			default:
				return usagef("--peer %q: use etcd (or leave it out)", peer)
			}
			if !cmd.Flags().Changed("failover-block") && contains(o.Modes, raftbench.ModeEtcd) {
				o.FailoverBlock = peerFailoverBlock
			}
			if o.FailoverBlock < 0 {
				return usagef("--failover-block %d: use 0 (every cluster up at once) or a positive number of trials", o.FailoverBlock)
			}
			if o.FailoverClients, err = splitList("--failover-client", clients, raftbench.FailoverClients); err != nil {
				return err
			}
			if o.ThroughputRoutings, err = splitList("--tp-routing", routings, []string{raftbench.RouteLeader, raftbench.RouteSpread}); err != nil {
				return err
			}
			if o.HeartbeatTicks < 0 {
				return usagef("--heartbeat-ticks %d: use a positive number of ticks (0: the node's default)", o.HeartbeatTicks)
			}
			if feModes != "" {
				if o.FalseModes, err = splitList("--fe-offload mode", feModes, raftbench.Modes); err != nil {
					return err
				}
				if peer != "" && !contains(o.FalseModes, peer) {
					o.FalseModes = append(o.FalseModes, peer)
				}
			}
			if o.FalsePhases, err = splitList("--fe-phases phase", phases, []string{"idle", "spinners", "starved-follower", "stress", "stress-disk"}); err != nil {
				return err
			}
			if auth {
				var k [16]byte
				if _, err := rand.Read(k[:]); err != nil {
					return fmt.Errorf("make cluster key: %w", err)
				}
				o.ClusterKey = hex.EncodeToString(k[:])
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
			if o.ThroughputRounds < 1 || o.ThroughputDuration < time.Second {
				return usagef("--tp-rounds %d, --tp-duration %v: use at least 1 round of at least 1s, e.g. --tp-rounds 6 --tp-duration 20s", o.ThroughputRounds, o.ThroughputDuration)
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
			if os.Getenv("KEDGE_BENCH_KEEP") == "" { // KEDGE_BENCH_KEEP=1 keeps the node logs and data
				defer os.RemoveAll(o.Dir)
			} else {
				defer fmt.Fprintf(cmd.ErrOrStderr(), "work directory kept: %s\n", o.Dir)
			}
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
	f.StringVar(&scenarios, "scenarios", "failover,false-elections,throughput,heartbeat", "which runs (comma-separated)")
	f.StringVar(&modes, "offload", "on,off", "kernel-path modes to compare (comma-separated: on = every kernel path, on-nowait = on without the quorum wait, on-noclose = on without the closed-connection failover, follower = the follower path without kernel heartbeats, off; xdp-pass = off with an XDP program that passes everything on each node's interface, a control; etcd = the peer, as --peer etcd)")
	f.StringVar(&clients, "failover-client", raftbench.ClientLeader, "failover writers, comma-separated, the trials alternating: leader (told which node died: asks every survivor for the new leader at once, writes to it), retry (told: tries the survivors in turn, 50 ms per attempt), uninformed (not told: writes to the leader it knew, finds out by a refused or reset connection or no answer within --failover-attempt, then asks every node for a newer leader); etcd's client has the survivors (told) or every node (uninformed) as endpoints")
	f.IntVar(&o.FailoverBlock, "failover-block", 0, fmt.Sprintf("failover in blocks of this many trials per client: one mode's cluster up at a time, started for its block and stopped (processes gone, namespaces and data removed) after it, the modes alternating block by block; 0: every mode's cluster up at once, the trials alternating one by one (default 0, %d with etcd among the modes: a user runs one store or the other, so neither's failovers should carry the other's heartbeats and fsyncs)", peerFailoverBlock))
	f.DurationVar(&o.FailoverAttempt, "failover-attempt", 0, "how long the uninformed failover clients wait for the leader they knew before they look for a new one; a write to the new leader is waited for up to 1s (0: the election timeout, at least 10ms)")
	f.StringVar(&peer, "peer", "", "run a peer system side by side in the same lab, as the baseline of every ratio: etcd (Debian's etcd-server 3.4, written to by its Go client; heartbeat a tenth of the election timeout, pre-vote on)")
	f.StringVar(&routings, "tp-routing", raftbench.RouteLeader, "throughput writers' routing, comma-separated: leader (every request to the leader) or spread (over every node in turn, as etcd's client balances; followers forward)")
	f.IntVar(&o.HeartbeatTicks, "heartbeat-ticks", 0, "leader heartbeat interval in ticks (0: the node's default, 1)")
	f.DurationVar(&o.HeartbeatLease, "heartbeat-lease", 0, "mode on: the kernel heartbeats' lease (0: the node's default)")
	f.DurationVar(&o.OffloadAlive, "offload-alive", 0, "modes on and follower: the follower program's alive bound (0: the node's default)")
	f.BoolVar(&auth, "auth", true, "give the clusters a random cluster key (every UDP packet authenticated)")
	f.StringVar(&phases, "fe-phases", "stress", "false-election phases (comma-separated: idle, spinners, starved-follower, stress, stress-disk)")
	f.IntVar(&o.StallIOPS, "fe-stall-iops", raftlab.StallIOPS, "stress-disk: the stalled node's disk writes per second")
	f.BoolVar(&o.UntilChange, "fe-until-change", false, "end each mode's false-election run at its first leader or term change (a shortest-safe-timeout search: that timeout is unsafe)")
	f.DurationVar(&o.HeartbeatDuration, "hb-duration", 10*time.Second, "idle window of the heartbeat CPU measurement")
	f.IntVar(&o.HeartbeatProbes, "hb-probes", 200, "heartbeat round-trip probes per mode")
	f.DurationVar(&o.Tick, "tick", 10*time.Millisecond, "raft tick of the nodes")
	f.StringVar(&electionTicks, "election-ticks", "3,10", "election timeouts to measure, in ticks")
	f.IntVar(&o.Nodes, "nodes", 3, "cluster size for failover and false elections")
	f.IntVar(&o.Trials, "trials", 50, "failover trials per election timeout")
	f.DurationVar(&o.FalseElectionDuration, "fe-duration", 30*time.Second, "length of each false-election phase (short default; a shortest-safe-timeout search wants 10m)")
	f.StringVar(&feModes, "fe-offload", "", "modes of the false-election runs (default: --offload)")
	f.StringVar(&tpNodes, "tp-nodes", "3", "cluster sizes for the throughput run")
	f.DurationVar(&o.ThroughputDuration, "tp-duration", 10*time.Second, "length of each mode's throughput run in each round")
	f.IntVar(&o.ThroughputRounds, "tp-rounds", 6, "throughput rounds (each runs every mode once, the order alternating)")
	f.BoolVar(&o.Concurrent, "tp-concurrent", false, "run every mode's throughput writers at the same time in each round (each cluster its own --clients) instead of in turn")
	f.BoolVar(&o.BPFStats, "tp-bpf-stats", false, "time the nodes' XDP programs during the throughput runs (BPF_ENABLE_STATS while the bench runs: every BPF program on the machine pays two clock reads per run)")
	f.IntVar(&o.Clients, "clients", 16, "concurrent writers in the throughput run")
	addBenchOutFlag(cmd, &out, "raft")
	return cmd
}

// peerFailoverBlock is --failover-block when etcd is among the modes and the flag is not given.
const peerFailoverBlock = 5

func splitList(what, s string, allowed []string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if !contains(allowed, p) {
			return nil, usagef("unknown %s %q: use %s", what, p, strings.Join(allowed, ", "))
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
		fmt.Fprintln(tw, "FAILOVER\tOFFLOAD\tELECTION TIMEOUT\tCLIENT\tTRIALS\tFAILED\tP50\tP99\tMAX")
		for _, f := range r.Failover {
			fmt.Fprintf(tw, "%d nodes\t%s\t%.0f ms\t%s\t%d\t%d\t%.1f ms\t%.1f ms\t%.1f ms\n", f.Nodes, f.Offload, f.ElectionTimeoutMs, f.Client, len(f.FailoverMs), f.Failed, f.P50Ms, f.P99Ms, f.MaxMs)
		}
		fmt.Fprintln(tw)
		if len(r.FailoverCompare) > 0 {
			fmt.Fprintln(tw, "FAILOVER RATIO\tMODE / ETCD\tELECTION TIMEOUT\tCLIENT\tP50\tP99")
			for _, c := range r.FailoverCompare {
				fmt.Fprintf(tw, "%d nodes\t%s / etcd\t%.0f ms\t%s\t%s\t%s\n", r.Failover[0].Nodes, c.Offload, c.ElectionTimeoutMs, c.Client, times(c.P50), times(c.P99))
			}
			fmt.Fprintln(tw)
		}
		if len(r.FailoverBlocks) > 0 {
			fmt.Fprintln(tw, "FAILOVER BLOCKS\tOFFLOAD\tELECTION TIMEOUT\tCLIENT\tTRIALS\tFAILED\tP50\tP99\tMAX\tCLUSTER UP\tLOAD AT START / END")
			for _, b := range r.FailoverBlocks {
				for _, c := range b.Clients {
					fmt.Fprintf(tw, "block %d\t%s\t%.0f ms\t%s\t%d\t%d\t%.1f ms\t%.1f ms\t%.1f ms\t%.0f ms\t%s\n", b.Block+1, b.Offload, b.ElectionTimeoutMs, c.Client,
						len(c.FailoverMs), c.Failed, c.P50Ms, c.P99Ms, c.MaxMs, b.UpMs, raftbench.BlockLoad(b))
				}
			}
			fmt.Fprintln(tw)
		}
		// The phases: each from the event before (p50 / p99 ms); heard-age is how old the
		// survivors' last word from the leader was at the kill.
		// etcd keeps no election record: its rows have no phases.
		fmt.Fprint(tw, "FAILOVER PHASES (p50 / p99 ms)\tOFFLOAD\tELECTION TIMEOUT\tCLIENT")
		for _, n := range raftbench.PhaseNames {
			fmt.Fprintf(tw, "\t%s", strings.ToUpper(n))
		}
		fmt.Fprintln(tw, "\tDETECTED BY KERNEL\tMORE THAN ONE ELECTION")
		for _, f := range r.Failover {
			if len(f.Phases) == 0 {
				continue
			}
			fmt.Fprintf(tw, "%d nodes\t%s\t%.0f ms\t%s", f.Nodes, f.Offload, f.ElectionTimeoutMs, f.Client)
			for _, p := range f.PhaseStats {
				fmt.Fprintf(tw, "\t%.1f / %.1f", p.P50Ms, p.P99Ms)
			}
			kernel, multi := 0, 0
			for _, p := range f.Phases {
				if p.Source == "kernel" {
					kernel++
				}
				if p.Terms > 1 {
					multi++
				}
			}
			fmt.Fprintf(tw, "\t%d/%d\t%d/%d\n", kernel, len(f.Phases), multi, len(f.Phases))
		}
		fmt.Fprintln(tw)
	}
	if len(r.FalseElections) > 0 {
		fmt.Fprintln(tw, "FALSE ELECTIONS\tOFFLOAD\tELECTION TIMEOUT\tDURATION\tLEADER CHANGES\tPER MINUTE\tTERM +\tLOAD AT START / END")
		for _, f := range r.FalseElections {
			fmt.Fprintf(tw, "%s\t%s\t%.0f ms\t%.0f s\t%d\t%.2f\t%d\t%s\n", raftbench.PhaseName(f), f.Offload, f.ElectionTimeoutMs, f.DurationS, f.LeaderChanges, f.PerMinute, f.TermIncrease, raftbench.LoadSpan(f))
		}
		fmt.Fprintln(tw)
		if stallTable(tw, r) {
			fmt.Fprintln(tw)
		}
		// Per mode and phase: the shortest timeout run with no leader change (and no term
		// change), and the failover at that timeout if it was measured.
		fmt.Fprintln(tw, "SHORTEST QUIET TIMEOUT\tOFFLOAD\tDURATION\tELECTION TIMEOUT\tFAILOVER P50\tFAILOVER P99\tTIMEOUTS RUN")
		for _, q := range raftbench.Quiet(r) {
			to, p50, p99 := "none", "-", "-"
			if q.ElectionTimeoutMs > 0 {
				to = fmt.Sprintf("%.0f ms", q.ElectionTimeoutMs)
			}
			if q.Failover != nil {
				p50, p99 = fmt.Sprintf("%.1f ms", q.Failover.P50Ms), fmt.Sprintf("%.1f ms", q.Failover.P99Ms)
			}
			fmt.Fprintf(tw, "%s\t%s\t%.0f s\t%s\t%s\t%s\t%s\n", q.Scenario, q.Offload, q.DurationS, to, p50, p99, q.Tried)
		}
		fmt.Fprintln(tw)
	}
	if len(r.ThroughputRuns) > 0 {
		throughputTables(tw, r)
	} else if len(r.Throughput) > 0 { // a result of before the rounds
		fmt.Fprintln(tw, "THROUGHPUT\tOFFLOAD\tCLIENTS\tWRITES/S\tP50\tP99\tMAX\tERRORS")
		for _, t := range r.Throughput {
			fmt.Fprintf(tw, "%d nodes\t%s\t%d\t%.0f\t%.2f ms\t%.2f ms\t%.1f ms\t%d\n", t.Nodes, t.Offload, t.Clients, t.PerSecond, t.P50Ms, t.P99Ms, t.MaxMs, t.Errors)
		}
		fmt.Fprintln(tw)
	}
	if len(r.Heartbeats) > 0 {
		fmt.Fprintln(tw, "HEARTBEATS\tOFFLOAD\tWINDOW\tRECEIVED\tIN XDP\tFOLLOWER CPU\tCPU/HEARTBEAT\tLEADER CPU\tPACER PASSES/S\tRTT P50\tRTT P99\tPROBES\tLOST")
		for _, h := range r.Heartbeats {
			fmt.Fprintf(tw, "follower\t%s\t%.0f s\t%d\t%d\t%.1f ms\t%.1f us\t%.1f ms\t%.0f\t%.0f us\t%.0f us\t%d\t%d\n", h.Offload, h.DurationS,
				h.Received, h.InXDP, h.ProcCPUMs, h.CPUPerHBUs, h.LeaderCPUMs, h.PacerPassesPerS, h.RTTP50Us, h.RTTP99Us, h.RTTProbes, h.RTTLost)
		}
	}
	return tw.Flush()
}

// stallTable prints the disk of each stress-disk run of kedge (false if there is none): the
// stalled node's slow saves, the other nodes', and whether the stalled node stopped
// answering for itself within the alive bound.
func stallTable(tw io.Writer, r *raftbench.Result) bool {
	found := false
	for _, f := range r.FalseElections {
		s := f.Stall
		if s == nil {
			continue
		}
		if !found {
			fmt.Fprintln(tw, "DISK STALL\tOFFLOAD\tELECTION TIMEOUT\tSTALLED NODE'S SLOW SAVES\tP50 / MAX\tOTHERS' SLOW SAVES\tOTHERS' MAX\tALIVE BOUND\tJUDGED\tHEARD LATE (MAYBE)\tLAST WORD MAX (LATEST READING)")
			found = true
		}
		fmt.Fprintf(tw, "node %d\t%s\t%.0f ms\t%d\t%.0f / %.0f ms\t%d\t%.0f ms\t%s\t%d\t%d (%d)\t%.0f ms (%.0f ms)\n", f.Stalled, f.Offload, f.ElectionTimeoutMs,
			s.SlowSaves, s.SaveP50Ms, s.SaveMaxMs, s.OtherSlowSaves, s.OtherSaveMaxMs, s.BoundText(), s.Judged, s.Late, s.LateMaybe, s.LastWordMaxMs, s.LastWordMaxLateMs)
	}
	return found
}

// routed names a throughput group's routing (", to the leader" / ", spread"); "" for
// results of before the routings.
func routed(r string) string {
	switch r {
	case "":
		return ""
	case raftbench.RouteLeader:
		return ", to the leader"
	}
	return ", " + r
}

// times prints a ratio, or "-" for none (NaN).
func times(x float64) string {
	if math.IsNaN(x) {
		return "-"
	}
	return fmt.Sprintf("%.3fx", x)
}

// throughputTables prints the throughput rounds (every run, in the order run), each round's
// ratios to the baseline, and the summary over the rounds.
func throughputTables(tw io.Writer, r *raftbench.Result) {
	fmt.Fprintln(tw, "THROUGHPUT RUNS\tROUND\tOFFLOAD\tCLIENTS\tWRITES/S\tP50\tP99\tMAX\tERRORS\tNODE CPU/WRITE\tMACHINE CPU/WRITE\tSOFTIRQ/WRITE\tXDP/WRITE\tKERNEL HEARTBEATS\tOTHER CLUSTERS CPU\tLOAD\tTERM +")
	for _, t := range r.ThroughputRuns {
		xdp := "-" // not timed (--tp-bpf-stats) or no program
		if t.XDPRunsPerWrite > 0 {
			xdp = fmt.Sprintf("%.0f ns, %.1f runs (%.1f raft)", t.XDPNsPerWrite, t.XDPRunsPerWrite, t.XDPRaftPerWrite)
		}
		khb := "-" // mode on only: heartbeats the leader's kernel sent, its pacer's passes, rounds user space covered
		if t.KernelHeartbeatsPerS > 0 || t.PacerPassesPerS > 0 {
			khb = fmt.Sprintf("%.0f/s, %.0f passes/s, %.1f overdue/s", t.KernelHeartbeatsPerS, t.PacerPassesPerS, t.OverduePerS)
		}
		machine, softirq := fmt.Sprintf("%.0f us", t.MachineCPUUs), fmt.Sprintf("%.1f us", t.SoftirqUs)
		if t.Concurrent { // the machine's figures are shared by the clusters that wrote at once
			machine, softirq = "-", "-"
		}
		fmt.Fprintf(tw, "%d nodes%s\t%d\t%s\t%d\t%.0f\t%.2f ms\t%.2f ms\t%.1f ms\t%d\t%.0f us\t%s\t%s\t%s\t%s\t%.0f ms\t%.1f\t%d\n", t.Nodes, routed(t.Routing), t.Round+1, t.Offload, t.Clients,
			t.PerSecond, t.P50Ms, t.P99Ms, t.MaxMs, t.Errors, t.NodeCPUUs, machine, softirq, xdp, khb, t.OtherCPUMs, t.Load1, t.TermChange)
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "THROUGHPUT, POOLED\tOFFLOAD\tROUNDS\tWRITES\tWRITES/S\tP50\tP99\tMAX\tERRORS")
	for _, t := range r.Throughput {
		fmt.Fprintf(tw, "%d nodes%s\t%s\t%d\t%d\t%.0f\t%.2f ms\t%.2f ms\t%.1f ms\t%d\n", t.Nodes, routed(t.Routing), t.Offload, t.Rounds, t.Writes, t.PerSecond, t.P50Ms, t.P99Ms, t.MaxMs, t.Errors)
	}
	fmt.Fprintln(tw)
	if len(r.ThroughputCompare) == 0 {
		return
	}
	fmt.Fprintln(tw, "THROUGHPUT PER ROUND\tROUND\tMODE / BASELINE\tWRITES/S\tP50\tP99\tNODE CPU/WRITE\tMACHINE CPU/WRITE")
	for _, c := range r.ThroughputCompare {
		machine := func(i int) string {
			if c.MachineCPU == nil || i >= len(c.MachineCPU.PerRound) {
				return "-"
			}
			return times(c.MachineCPU.PerRound[i])
		}
		for i := range c.PerSecond.PerRound {
			fmt.Fprintf(tw, "%d nodes%s\t%d\t%s / %s\t%s\t%s\t%s\t%s\t%s\n", c.Nodes, routed(c.Routing), i+1, c.Offload, c.Baseline,
				times(c.PerSecond.PerRound[i]), times(c.P50.PerRound[i]), times(c.P99.PerRound[i]), times(c.NodeCPU.PerRound[i]), machine(i))
		}
	}
	fmt.Fprintln(tw)
	// Median ratio over the rounds [min-max], the rounds with the ratio below 1, and p: the
	// two-sided sign test of "below and above 1 equally likely".
	fmt.Fprintln(tw, "THROUGHPUT RATIO\tMODE / BASELINE\tROUNDS\tWRITES/S\tP50\tP99\tNODE CPU/WRITE\tMACHINE CPU/WRITE")
	cell := func(x *raftbench.Ratio) string {
		if x == nil || math.IsNaN(x.Median) { // no figure (the machine's, for writers that ran at once)
			return "-"
		}
		return fmt.Sprintf("%.3fx [%.3f-%.3f] %d below 1, p=%.2f", x.Median, x.Min, x.Max, x.Below, x.SignP)
	}
	for _, c := range r.ThroughputCompare {
		fmt.Fprintf(tw, "%d nodes%s\t%s / %s\t%d\t%s\t%s\t%s\t%s\t%s\n", c.Nodes, routed(c.Routing), c.Offload, c.Baseline, c.Rounds,
			cell(&c.PerSecond), cell(&c.P50), cell(&c.P99), cell(&c.NodeCPU), cell(c.MachineCPU))
	}
	fmt.Fprintln(tw)
}
