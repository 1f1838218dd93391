package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kedge-dev/kedge/internal/raft/api"
	"github.com/kedge-dev/kedge/internal/raft/client"
	"github.com/kedge-dev/kedge/internal/raft/config"
	"github.com/kedge-dev/kedge/internal/raft/node"
	"github.com/kedge-dev/kedge/pkg/raft/kernelpaths"
)

func init() { register(newRaftCmd) }

// raftSubcmds lets other files add commands under 'kedge raft' (raft_lab.go adds 'lab').
var raftSubcmds []func() *cobra.Command

func registerRaft(fn func() *cobra.Command) { raftSubcmds = append(raftSubcmds, fn) }

func newRaftCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "raft",
		Short: "A replicated key-value store on etcd-io/raft (node, client, status)",
		Long: `kedge raft runs one node of a replicated key-value store whose consensus core is
go.etcd.io/raft/v3, and talks to it. docs/raft.md describes the config, the client API,
the packet format and the storage.`,
	}
	cmd.AddCommand(newRaftServeCmd(), newRaftKVCmd(), newRaftStatusCmd())
	for _, fn := range raftSubcmds {
		cmd.AddCommand(fn())
	}
	return cmd
}

func newRaftServeCmd() *cobra.Command {
	var (
		cfgPath, dataDir string
		id               uint64
		duration         time.Duration
		unsafeReads      bool
		offloadOn        bool
		kernelHB         bool
		quorumWait       bool
		closeFailover    bool
		hbLease          time.Duration
		offloadAlive     time.Duration
	)
	cmd := &cobra.Command{
		Use:   "serve --config node.yaml",
		Short: "Run one raft node until SIGINT/SIGTERM or --duration",
		Long: `Runs one node: etcd-raft with a write-ahead log in data_dir, the raft transport (UDP for
small messages, TCP for appends and snapshots) and the HTTP/JSON client API with /metrics.
The node is ready when GET /v1/status on its client address answers.

Kernel paths (--offload and --kernel-heartbeats, on by default where possible: Linux 5.15+,
a raft address on a real interface): an XDP program answers the leader's heartbeats while
the node's loop is alive and a bpf_timer wakes the node to start a pre-vote when the leader
falls silent (docs/raft.md section 14); as leader, the kernel sends the heartbeats while a
lease the node renews holds ("Kernel paths: leader heartbeats"). /v1/status shows
"offload" when the follower path runs.

Exit codes: 0 stopped by signal or --duration, 1 runtime error, 2 bad flags or config,
3 an explicit --offload on a kernel that lacks what it needs.`,
		Example: `  # a 3-node cluster on one machine, one shared config, three processes
  kedge raft serve --config cluster.yaml --id 1 &
  kedge raft serve --config cluster.yaml --id 2 &
  kedge raft serve --config cluster.yaml --id 3 &
  kedge raft status --config cluster.yaml

  # the same node without the kernel paths (to compare)
  kedge raft serve --config cluster.yaml --id 1 --offload=false

  # as leader, the kernel sends the heartbeats while a 200ms lease holds (fail if it cannot)
  kedge raft serve --config cluster.yaml --id 1 --kernel-heartbeats --heartbeat-lease 200ms

  # a fast-failover cluster: 1ms ticks, 15ms election timeout, heartbeats every 5ms
  # (tick: 1ms, election_ticks: 15, heartbeat_ticks: 5 in the config)
  kedge raft serve --config fast.yaml --id 1`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cfgPath == "" {
				return usagef("--config is required (docs/raft.md section 1 shows the format)")
			}
			cfg, err := config.Load(cfgPath, id, dataDir)
			if err != nil {
				return usagef("%w (docs/raft.md section 1 shows the format)", err)
			}
			mode := kernelpaths.Off
			switch {
			case offloadOn && cmd.Flags().Changed("offload"):
				mode = kernelpaths.On
				// What can be known before anything is opened: the address, the kernel.
				a, err := config.ResolveAddr(cfg.RaftBind())
				if err != nil {
					return usagef("raft address: %w", err)
				}
				if err := kernelpaths.CheckAddr(a.Addr()); err != nil {
					return usagef("--offload: %w", err)
				}
				if err := kernelpaths.Probe(); err != nil {
					return err // a *kedge.FeatureError: exit 3
				}
			case offloadOn:
				mode = kernelpaths.Auto
			}
			if offloadAlive < 0 {
				return usagef("--offload-alive %v: use a positive duration (0: adaptive)", offloadAlive)
			}
			if hbLease < 0 {
				return usagef("--heartbeat-lease %v: use a positive duration (0: adaptive)", hbLease)
			}
			hbMode := kernelpaths.Off
			switch {
			case kernelHB && cmd.Flags().Changed("kernel-heartbeats"):
				hbMode = kernelpaths.On
			case kernelHB:
				hbMode = kernelpaths.Auto
			}
			n, err := node.New(cfg, node.Options{UnsafeLocalReads: unsafeReads, Offload: mode, OffloadAlive: offloadAlive, Log: slog.Default(),
				KernelHeartbeats: hbMode, HeartbeatLease: hbLease, NoQuorumWait: !quorumWait,
				NoCloseFailover: !closeFailover})
			if err != nil {
				return fmt.Errorf("start node %d: %w", cfg.ID, err)
			}
			ctx, cancel := untilDone(cmd.Context(), duration)
			defer cancel()
			slog.Info("raft: serving", "id", cfg.ID, "raft", cfg.RaftBind(), "client", n.ClientAddr(), "offload", n.OffloadMode())
			return n.Run(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfgPath, "config", "", "node config (YAML, docs/raft.md section 1)")
	f.Uint64Var(&id, "id", 0, "this node's id (overrides id: in the config)")
	f.StringVar(&dataDir, "data-dir", "", "data directory (overrides data_dir: in the config)")
	addDurationFlag(cmd, &duration, "stop")
	f.BoolVar(&offloadOn, "offload", true, "kernel paths: heartbeats answered in XDP, leader failure detected in the kernel (default: where possible; --offload=false to compare; an explicit --offload fails where it cannot run)")
	// The checker's self-test only: not linearizable (docs/raft.md section 7).
	f.BoolVar(&unsafeReads, "unsafe-local-reads", false, "serve reads from local state without ReadIndex (NOT linearizable)")
	f.MarkHidden("unsafe-local-reads")
	f.BoolVar(&kernelHB, "kernel-heartbeats", true, "as leader, let the kernel send the heartbeats while a lease holds (default: where possible; --kernel-heartbeats=false to compare; an explicit --kernel-heartbeats fails where it cannot run; docs/raft.md: Kernel paths)")
	f.DurationVar(&offloadAlive, "offload-alive", 0, "with --offload: how long one refresh of the node's persist/apply loop keeps its XDP program answering for it (0: adaptive: the election timeout, at least 100ms, raised up to 1s while the process waits for a CPU)")
	f.BoolVar(&quorumWait, "quorum-wait", true, "with --offload, as leader: absorb in XDP the followers' append acknowledgements that move neither their match nor the commit, stepped a tick later from the kernel's record (--quorum-wait=false to compare; docs/raft.md: Electrode)")
	f.BoolVar(&closeFailover, "close-failover", true, "with --offload, as follower: when every connection with the leader is closed or reset by it (its process killed), campaign at once, staggered among the survivors, instead of after the election timeout (--close-failover=false to compare; docs/raft.md: A leader whose connections closed)")
	f.DurationVar(&hbLease, "heartbeat-lease", 0, "with --kernel-heartbeats: how long one renewal keeps the kernel sending (0: adaptive, as --offload-alive)")
	return cmd
}

// raftTarget is the --endpoints/--config pair of the client commands.
type raftTarget struct {
	endpoints string
	cfgPath   string
	timeout   time.Duration
}

func (t *raftTarget) flags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&t.endpoints, "endpoints", "", "client addresses host:port,... of the nodes to ask")
	cmd.Flags().StringVar(&t.cfgPath, "config", "", "take the client addresses from this node config's peers")
	cmd.Flags().DurationVar(&t.timeout, "timeout", 10*time.Second, "give up after this long")
}

func (t *raftTarget) list() ([]string, error) {
	switch {
	case t.endpoints != "" && t.cfgPath != "":
		return nil, usagef("give --endpoints or --config, not both")
	case t.endpoints != "":
		var eps []string
		for _, e := range strings.Split(t.endpoints, ",") {
			if e = strings.TrimSpace(e); e != "" {
				eps = append(eps, e)
			}
		}
		if len(eps) == 0 {
			return nil, usagef("--endpoints is empty: give host:port,...")
		}
		return eps, nil
	case t.cfgPath != "":
		// Any node's config names all peers; id and data_dir do not matter here.
		peers, err := config.LoadPeers(t.cfgPath)
		if err != nil {
			return nil, usagef("%w", err)
		}
		var eps []string
		for _, p := range peers {
			eps = append(eps, p.Client)
		}
		return eps, nil
	}
	return nil, usagef("give --endpoints host:port,... or --config node.yaml")
}

func newRaftKVCmd() *cobra.Command {
	var (
		t            raftTarget
		output       string
		expectAbsent bool
	)
	cmd := &cobra.Command{
		Use:   "kv get KEY | put KEY VALUE | del KEY | cas KEY OLD NEW",
		Short: "Read and write keys (linearizable)",
		Long: `Reads and writes keys through any node: writes are forwarded to the leader by raft and
answered once applied; reads go through ReadIndex. The endpoints are tried in order; the
next one is asked when a node refuses the connection or has no leader (503). When every one
did, all are asked again (after 50 ms, doubling up to 1 s) until --timeout: a command
started while the cluster comes up or elects a leader waits for it, as an etcd client does.

A write that timed out (504) or lost its connection is reported as "outcome unknown" and
not retried: it may still commit. Exit codes: 0 done (for cas: also when it did not swap,
see "ok"), 1 error or unknown outcome, 2 bad usage.`,
		Example: `  kedge raft kv put --config cluster.yaml greeting hello
  kedge raft kv get --endpoints 127.0.0.1:8001,127.0.0.1:8002 greeting
  kedge raft kv cas --config cluster.yaml greeting hello bonjour
  kedge raft kv cas --config cluster.yaml --expect-absent counter 1
  kedge raft kv del --config cluster.yaml greeting -o json`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("kedge raft kv needs an operation: get, put, del or cas (see 'kedge raft kv --help')")
			}
			op, args := args[0], args[1:]
			want := map[string]int{"get": 1, "put": 2, "del": 1, "cas": 3}
			n, ok := want[op]
			if !ok {
				return usagef("unknown kv operation %q: use get, put, del or cas", op)
			}
			if op == "cas" && expectAbsent {
				n = 2
			} else if expectAbsent {
				return usagef("--expect-absent goes with cas only")
			}
			if len(args) != n {
				return usagef("kv %s takes %d argument(s), got %d (see 'kedge raft kv --help')", op, n, len(args))
			}
			eps, err := t.list()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), t.timeout)
			defer cancel()
			c := &client.Client{Endpoints: eps, Retry: true}
			var res any
			var text string
			switch op {
			case "get":
				r, err := c.Get(ctx, args[0])
				if err != nil {
					return kvErr(err)
				}
				res, text = r, r.Value
				if !r.Found {
					text = "(not found)"
				}
			case "put":
				r, err := c.Put(ctx, args[0], args[1])
				if err != nil {
					return kvErr(err)
				}
				res, text = r, fmt.Sprintf("ok (index %d)", r.Index)
			case "del":
				r, err := c.Delete(ctx, args[0])
				if err != nil {
					return kvErr(err)
				}
				res, text = r, fmt.Sprintf("deleted (index %d, existed: %v)", r.Index, r.Found)
			case "cas":
				var r api.WriteResponse
				if expectAbsent {
					r, err = c.CAS(ctx, args[0], "", true, args[1])
				} else {
					r, err = c.CAS(ctx, args[0], args[1], false, args[2])
				}
				if err != nil {
					return kvErr(err)
				}
				res, text = r, fmt.Sprintf("swapped (index %d)", r.Index)
				if !r.OK {
					text = "not swapped: key absent"
					if r.Found {
						text = fmt.Sprintf("not swapped: current value %q", r.Value)
					}
				}
			}
			return writeReport(cmd.OutOrStdout(), output, res, func(w io.Writer) error {
				_, err := fmt.Fprintln(w, text)
				return err
			})
		},
	}
	t.flags(cmd)
	cmd.Flags().BoolVar(&expectAbsent, "expect-absent", false, "cas: swap only if the key does not exist (then: cas KEY NEW)")
	addOutputFlag(cmd, &output)
	return cmd
}

func kvErr(err error) error {
	if client.Unknown(err) {
		return fmt.Errorf("write outcome unknown: %w", err)
	}
	return err
}

// raftNodeStatus is one row of 'kedge raft status'.
type raftNodeStatus struct {
	Endpoint string      `json:"endpoint"`
	Error    string      `json:"error,omitempty"`
	Status   *api.Status `json:"status,omitempty"`
}

func newRaftStatusCmd() *cobra.Command {
	var (
		t      raftTarget
		output string
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show every node: state, leader, term, commit and applied index, last heartbeat",
		Long: `Asks every node for its status. LAST-HB is, on a follower, the time since it last heard
from the leader and, on the leader, the oldest time since a follower answered (with the
kernel paths on, the kernel's record where it answers for the node). BOUND is the kernel
paths' alive bound in force (how long the kernel answers for the node after its last pass;
it rises toward 1s while the machine is short of CPU, docs/raft.md "The adaptive bound"),
"-" when the follower path is off.
Exit codes: 0 every node answered, 1 some did not, 2 bad usage.`,
		Example: `  kedge raft status --config cluster.yaml
  kedge raft status --endpoints 10.77.0.1:8000,10.77.0.2:8000 -o json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			eps, err := t.list()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), t.timeout)
			defer cancel()
			rows := make([]raftNodeStatus, len(eps))
			var wg sync.WaitGroup
			for i, ep := range eps {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rows[i].Endpoint = ep
					s, err := (&client.Client{}).Status(ctx, ep)
					if err != nil {
						rows[i].Error = err.Error()
						return
					}
					rows[i].Status = &s
				}()
			}
			wg.Wait()
			err = writeReport(cmd.OutOrStdout(), output, struct {
				Nodes []raftNodeStatus `json:"nodes"`
			}{rows}, func(w io.Writer) error { return raftStatusTable(w, rows) })
			if err != nil {
				return err
			}
			for _, r := range rows {
				if r.Error != "" {
					return errors.New("some nodes did not answer (see the table)")
				}
			}
			return nil
		},
	}
	t.flags(cmd)
	addOutputFlag(cmd, &output)
	return cmd
}

func raftStatusTable(w io.Writer, rows []raftNodeStatus) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tLEADER\tTERM\tCOMMIT\tAPPLIED\tLAST-HB\tBOUND\tADDRESS")
	for _, r := range rows {
		s := r.Status
		if s == nil {
			fmt.Fprintf(tw, "-\t-\t-\t-\t-\t-\t-\t-\t%s (unreachable: %s)\n", r.Endpoint, r.Error)
			continue
		}
		hb := "-"
		if s.LastHeartbeatMs != nil {
			hb = fmt.Sprintf("%.1fms", *s.LastHeartbeatMs)
		}
		bound := "-"
		if s.AliveBoundMs != nil {
			bound = fmt.Sprintf("%.0fms", *s.AliveBoundMs)
		}
		state := s.State
		if s.UnsafeLocalReads {
			state += " (UNSAFE READS)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", s.ID, state, s.Leader, s.Term, s.Commit, s.Applied, hb, bound, r.Endpoint)
	}
	return tw.Flush()
}
