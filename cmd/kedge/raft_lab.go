package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kedge-dev/kedge/internal/lab"
	"github.com/kedge-dev/kedge/internal/raftlab"
	"github.com/kedge-dev/kedge/internal/runstate"
)

func init() { registerRaft(newRaftLabCmd) }

func raftLabDir(name string) string { return raftlab.LabDir(name) }

func newRaftLabCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "A lab cluster: 3, 5 or 7 node processes in namespaces behind a fault fabric",
		Long: `'kedge raft lab up' starts a cluster of 'kedge raft serve' processes, one per lab host
n1..nN, plus a host 'client' for clients, joined by a router namespace (the fabric). The
fabric's fault program sits below the nodes' interfaces: partitions (any split, one-way),
loss, duplication, delay and reordering per link; the supervisor process that 'up' leaves
behind also kills, restarts, pauses and starves nodes on request ('kedge raft lab fault').

The nodes are reachable from the client host:
  kedge lab exec NAME client -- kedge raft kv --config DIR/cluster.yaml put a 1
('up' prints the exact lines). docs/raft.md walks through it.`,
		Example: `  sudo kedge raft lab up --name demo --nodes 3
  sudo kedge lab exec demo client -- kedge raft status --config /run/kedge/raft-lab/demo/cluster.yaml
  sudo kedge raft lab fault demo kill leader
  sudo kedge raft lab fault demo partition 1 2,3
  sudo kedge raft lab fault demo heal
  sudo kedge raft lab status demo
  sudo kedge raft lab down demo`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return usagef("kedge raft lab needs a command: up, down, status or fault (see 'kedge raft lab --help')")
		},
	}
	cmd.AddCommand(newRaftLabUpCmd(), newRaftLabSuperviseCmd(), newRaftLabDownCmd(), newRaftLabStatusCmd(), newRaftLabFaultCmd())
	return cmd
}

type raftLabFlags struct {
	name          string
	nodes         int
	tick          time.Duration
	electionTicks int
	unsafeReads   bool
	nodeDisks     bool
}

func (f *raftLabFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.name, "name", "raft", "lab name (namespaces kedge-lab-NAME-n1 ... and kedge-lab-NAME-client)")
	cmd.Flags().IntVar(&f.nodes, "nodes", 3, "number of nodes: 3, 5 or 7")
	cmd.Flags().DurationVar(&f.tick, "tick", 0, "raft tick (0: the node's default, 10ms)")
	cmd.Flags().IntVar(&f.electionTicks, "election-ticks", 0, "election timeout in ticks (0: the node's default, 10)")
	cmd.Flags().BoolVar(&f.nodeDisks, "node-disks", false, "give every node a disk of its own (ext4 on a loop device), so that the stall fault stalls that node's disk alone")
	cmd.Flags().BoolVar(&f.unsafeReads, "unsafe-local-reads", false, "start the nodes in the deliberately broken read mode (for the checker)")
	_ = cmd.Flags().MarkHidden("unsafe-local-reads")
}

func (f *raftLabFlags) args() []string {
	a := []string{"--name", f.name, "--nodes", strconv.Itoa(f.nodes), "--tick", f.tick.String(), "--election-ticks", strconv.Itoa(f.electionTicks)}
	if f.unsafeReads {
		a = append(a, "--unsafe-local-reads")
	}
	if f.nodeDisks {
		a = append(a, "--node-disks")
	}
	return a
}

func (f *raftLabFlags) check() error {
	if err := lab.ValidName(f.name); err != nil {
		return usagef("%v", err)
	}
	if f.nodes != 3 && f.nodes != 5 && f.nodes != 7 {
		return usagef("--nodes %d: use 3, 5 or 7", f.nodes)
	}
	if f.tick < 0 || f.electionTicks < 0 {
		return usagef("--tick and --election-ticks must not be negative")
	}
	return nil
}

func newRaftLabUpCmd() *cobra.Command {
	var (
		f      raftLabFlags
		output string
	)
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Start a lab cluster and leave its supervisor running",
		Example: `  sudo kedge raft lab up --name demo --nodes 3
  sudo kedge raft lab up --name five --nodes 5 --election-ticks 20 -o json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.check(); err != nil {
				return err
			}
			if err := requireBenchRoot(cmd); err != nil {
				return err
			}
			dir := raftLabDir(f.name)
			if _, err := raftlab.Control(dir, raftlab.Request{Op: "status"}, time.Second); err == nil {
				return usagef("lab cluster %s is running already: remove it with 'kedge raft lab down %s'", f.name, f.name)
			}
			if names, _ := lab.ListPersistent(); contains(names, f.name) {
				return usagef("a lab named %s exists: pick another --name or remove it with 'kedge lab down %s'", f.name, f.name)
			}
			if err := os.RemoveAll(dir); err != nil {
				return fmt.Errorf("clear %s: %w", dir, err)
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return fmt.Errorf("make %s: %w", dir, err)
			}
			info, err := startSupervisor(dir, f.args())
			if err != nil {
				return err
			}
			return writeReport(cmd.OutOrStdout(), output, info, func(w io.Writer) error {
				if err := raftLabTable(w, info); err != nil {
					return err
				}
				fmt.Fprintf(w, `
lab cluster %[1]s is up (supervisor pid %[2]d, fault delay line: %[3]s). Next:
  kedge lab exec %[1]s client -- kedge raft status --config %[4]s
  kedge lab exec %[1]s client -- kedge raft kv --config %[4]s put greeting hello
  kedge raft lab fault %[1]s kill leader        (then: fault %[1]s start killed)
  kedge raft lab down %[1]s
`, info.Name, info.Supervisor, info.DelayBackend, info.Config)
				return nil
			})
		},
	}
	f.add(cmd)
	addOutputFlag(cmd, &output)
	return cmd
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// startSupervisor re-runs this binary as 'kedge raft lab supervise' in its own session and
// waits until it has written the ready file (or exited).
func startSupervisor(dir string, args []string) (*raftlab.Info, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find the kedge binary: %w", err)
	}
	logf, err := os.OpenFile(filepath.Join(dir, raftlab.SupervisorLog), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open supervisor log: %w", err)
	}
	defer logf.Close()
	c := exec.Command(self, append([]string{"raft", "lab", "supervise", "--dir", dir}, args...)...)
	c.Stdout, c.Stderr = logf, logf
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := c.Start(); err != nil {
		return nil, fmt.Errorf("start supervisor: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- c.Wait() }()
	deadline := time.After(90 * time.Second)
	for {
		if b, err := os.ReadFile(filepath.Join(dir, raftlab.ReadyFile)); err == nil && len(b) > 0 {
			resp, err := raftlab.Control(dir, raftlab.Request{Op: "status"}, 5*time.Second)
			if err != nil {
				return nil, err
			}
			return resp.Info, nil
		}
		select {
		case err := <-exited:
			b, _ := os.ReadFile(filepath.Join(dir, raftlab.SupervisorLog))
			return nil, fmt.Errorf("lab cluster supervisor exited (%v) before the cluster was up:\n%s", err, tailBytes(b, 3000))
		case <-deadline:
			_ = c.Process.Signal(syscall.SIGTERM)
			return nil, fmt.Errorf("lab cluster not up after 90s: see %s", filepath.Join(dir, raftlab.SupervisorLog))
		case <-time.After(20 * time.Millisecond): // polling for the ready file
		}
	}
}

func tailBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

func newRaftLabSuperviseCmd() *cobra.Command {
	var (
		f   raftLabFlags
		dir string
	)
	cmd := &cobra.Command{
		Use:    "supervise",
		Short:  "Run a lab cluster in the foreground (what 'up' leaves running)",
		Hidden: true,
		Args:   noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.check(); err != nil {
				return err
			}
			self, err := os.Executable()
			if err != nil {
				return fmt.Errorf("find the kedge binary: %w", err)
			}
			ctx, stop := untilDone(cmd.Context(), 0)
			defer stop()
			upCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
			c, err := raftlab.Up(upCtx, raftlab.Spec{Name: f.name, Nodes: f.nodes, Binary: self, Dir: dir,
				Tick: f.tick, ElectionTicks: f.electionTicks, UnsafeLocalReads: f.unsafeReads, Persistent: true, NodeDisks: f.nodeDisks})
			cancel()
			if err != nil {
				return err
			}
			s := raftlab.NewSupervisor(c)
			sctx, cancelServe := context.WithCancel(ctx)
			errc := make(chan error, 1)
			go func() { errc <- s.Serve(sctx) }()
			fmt.Fprintf(os.Stderr, "lab cluster %s up: %d nodes, control socket %s\n", f.name, f.nodes, filepath.Join(dir, raftlab.ControlSocket))
			select {
			case <-ctx.Done():
			case <-s.Down():
			case err = <-errc:
			}
			cancelServe()
			s.Stop()
			err = errors.Join(err, c.Close(), os.RemoveAll(dir))
			fmt.Fprintf(os.Stderr, "lab cluster %s down (%v)\n", f.name, err)
			return err
		},
	}
	f.add(cmd)
	cmd.Flags().StringVar(&dir, "dir", "", "cluster directory")
	return cmd
}

func newRaftLabDownCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "down NAME",
		Short:   "Stop a lab cluster: its nodes, fabric, namespaces and directory",
		Example: `  sudo kedge raft lab down demo`,
		Args:    exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if err := lab.ValidName(name); err != nil {
				return usagef("%v", err)
			}
			dir := raftLabDir(name)
			resp, err := raftlab.Control(dir, raftlab.Request{Op: "down"}, 10*time.Second)
			if err != nil {
				// No supervisor (killed?): remove what is left by hand.
				return raftLabForceDown(cmd.OutOrStdout(), name, dir, err)
			}
			pid := resp.Info.Supervisor
			deadline := time.Now().Add(30 * time.Second)
			for runstate.ProcessAlive(pid) {
				if time.Now().After(deadline) {
					return fmt.Errorf("supervisor pid %d still running 30s after 'down': see %s", pid, filepath.Join(dir, raftlab.SupervisorLog))
				}
				time.Sleep(10 * time.Millisecond) // polling the supervisor's exit
			}
			fmt.Fprintf(cmd.OutOrStdout(), "lab cluster %s removed\n", name)
			return nil
		},
	}
}

// raftLabForceDown removes a cluster whose supervisor does not answer.
func raftLabForceDown(w io.Writer, name, dir string, cause error) error {
	_, statErr := os.Stat(dir)
	removed, err := raftlab.ForceDown(name, dir)
	if removed == 0 && os.IsNotExist(statErr) {
		return usagef("no lab cluster %s (%v)", name, cause)
	}
	fmt.Fprintf(w, "lab cluster %s: supervisor unreachable (%v); removed %d namespaces and %s\n", name, cause, removed, dir)
	return err
}

func newRaftLabStatusCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:     "status NAME",
		Short:   "Show a lab cluster's nodes (process, raft state) and the faults in force",
		Example: `  sudo kedge raft lab status demo -o json`,
		Args:    exactArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			resp, err := raftLabControl(args[0], raftlab.Request{Op: "status"})
			if err != nil {
				return err
			}
			return writeReport(cmd.OutOrStdout(), output, resp.Info, func(w io.Writer) error { return raftLabTable(w, resp.Info) })
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

func raftLabControl(name string, req raftlab.Request) (raftlab.Response, error) {
	if err := lab.ValidName(name); err != nil {
		return raftlab.Response{}, usagef("%v", err)
	}
	resp, err := raftlab.Control(raftLabDir(name), req, 20*time.Second)
	if err != nil && resp.Error == "" {
		return resp, fmt.Errorf("%w - is lab cluster %s up? (kedge raft lab up --name %s)", err, name, name)
	}
	return resp, err
}

func raftLabTable(w io.Writer, in *raftlab.Info) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tPID\tCLIENT\tSTATE\tLEADER\tTERM\tCOMMIT\tNOTE")
	for _, n := range in.Nodes {
		state, leader, term, commit, note := "-", "-", "-", "-", ""
		switch {
		case n.PID == 0:
			note = "killed"
		case n.Paused:
			note = "paused (SIGSTOP)"
		case n.Status != nil:
			state, leader = n.Status.State, strconv.FormatUint(n.Status.Leader, 10)
			term, commit = strconv.FormatUint(n.Status.Term, 10), strconv.FormatUint(n.Status.Commit, 10)
		case n.Unanswered != "":
			note = "no answer"
		}
		if n.Starved {
			note = strings.TrimSpace(note + " starved")
		}
		if n.Stalled {
			note = strings.TrimSpace(note + " disk-stalled")
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", n.ID, n.PID, n.Client, state, leader, term, commit, note)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(in.Rules) == 0 {
		fmt.Fprintln(w, "faults: none")
	}
	for _, r := range in.Rules {
		fmt.Fprintf(w, "fault %s -> %s: %s\n", r.Link.From, r.Link.To, r.Fault)
	}
	return nil
}

func newRaftLabFaultCmd() *cobra.Command {
	var (
		from, to  string
		fault     lab.LinkFault
		spinners  int
		writeIOPS int
		output    string
	)
	cmd := &cobra.Command{
		Use:   "fault NAME KIND [ARGS]",
		Short: "Inject or heal a fault: partition, oneway, net, heal, kill, start, pause, resume, starve, unstarve, stall, unstall",
		Long: `Kinds:
  partition G1 G2 [G3...]   split the nodes into groups (comma-separated ids), both directions
  oneway FROM TO            drop packets from the nodes FROM to the nodes TO (comma lists)
  net                       per-link faults on the links --from -> --to (default: all nodes):
                            --loss, --dup (probabilities), --delay, --jitter, --share (reordering)
  heal                      remove every link fault
  kill N|leader             kill -9 the node (restart it with 'start N' or 'start killed')
  start N|killed            start a killed node again (from its data directory); 'killed'
                            names the one node that is down
  pause N|leader, resume N  SIGSTOP / SIGCONT
  starve N|leader, unstarve N   pin the node to one CPU with --spinners busy threads there
  stall N|leader, unstall N     stall the node's disk: its writes limited to --write-iops
                            a second (a blkio cgroup of its own), so each fsync takes
                            hundreds of ms`,
		Example: `  sudo kedge raft lab fault demo partition 1 2,3
  sudo kedge raft lab fault demo oneway 2,3 1
  sudo kedge raft lab fault demo net --loss 0.1 --dup 0.05 --delay 5ms --jitter 10ms --share 0.3
  sudo kedge raft lab fault demo kill leader
  sudo kedge raft lab fault demo start killed
  sudo kedge raft lab fault demo stall 2 --write-iops 10
  sudo kedge raft lab fault demo heal`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 {
				return usagef("kedge raft lab fault needs a lab and a kind, e.g. 'kedge raft lab fault demo heal'")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			name, kind, rest := args[0], args[1], args[2:]
			req := raftlab.Request{Op: kind, Spinners: spinners, WriteIOPS: writeIOPS}
			var err error
			switch kind {
			case "partition":
				if len(rest) < 2 {
					return usagef("partition needs at least two groups, e.g. 'partition 1 2,3'")
				}
				for _, g := range rest {
					ids, err := parseIDs(g)
					if err != nil {
						return err
					}
					req.Groups = append(req.Groups, ids)
				}
			case "oneway":
				if len(rest) != 2 {
					return usagef("oneway needs FROM and TO, e.g. 'oneway 2,3 1'")
				}
				if req.From, err = parseIDs(rest[0]); err != nil {
					return err
				}
				if req.To, err = parseIDs(rest[1]); err != nil {
					return err
				}
			case "net":
				if fault.IsZero() {
					return usagef("net needs at least one of --loss, --dup, --delay, --jitter")
				}
				if err := fault.Validate(); err != nil {
					return usagef("%v", err)
				}
				req.Fault = fault
				if from != "" {
					if req.From, err = parseIDs(from); err != nil {
						return err
					}
				}
				if to != "" {
					if req.To, err = parseIDs(to); err != nil {
						return err
					}
				}
			case "heal":
			case "kill", "start", "pause", "resume", "starve", "unstarve", "stall", "unstall":
				if len(rest) != 1 {
					return usagef("%s needs a node id (or 'leader' to kill, pause, starve or stall; 'killed' to start)", kind)
				}
				if writeIOPS < 1 {
					return usagef("--write-iops %d: use at least 1", writeIOPS)
				}
				// The node a kind may name instead of an id: the leader to kill, pause, starve or stall,
				// the one node that is down to start.
				alias := map[string]string{"kill": "leader", "pause": "leader", "starve": "leader", "stall": "leader", "start": "killed"}[kind]
				if alias == "" || rest[0] != alias {
					if req.Node, err = strconv.Atoi(rest[0]); err != nil || req.Node < 1 {
						if alias != "" {
							alias = " or '" + alias + "'"
						}
						return usagef("node %q: use a node id from 1%s", rest[0], alias)
					}
				}
			default:
				return usagef("unknown fault kind %q: use partition, oneway, net, heal, kill, start, pause, resume, starve, unstarve, stall or unstall", kind)
			}
			resp, err := raftLabControl(name, req)
			if err != nil {
				return err
			}
			return writeReport(cmd.OutOrStdout(), output, resp, func(w io.Writer) error {
				fmt.Fprintln(w, resp.Done)
				return raftLabTable(w, resp.Info)
			})
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "net: the sending nodes (comma-separated ids; default all)")
	cmd.Flags().StringVar(&to, "to", "", "net: the receiving nodes (default all)")
	cmd.Flags().Float64Var(&fault.Loss, "loss", 0, "net: probability a packet is dropped")
	cmd.Flags().Float64Var(&fault.Dup, "dup", 0, "net: probability a packet is duplicated")
	cmd.Flags().DurationVar(&fault.Delay, "delay", 0, "net: hold packets this long")
	cmd.Flags().DurationVar(&fault.Jitter, "jitter", 0, "net: plus a uniform 0..jitter")
	cmd.Flags().Float64Var(&fault.DelayShare, "share", 0, "net: fraction of packets delayed (the rest overtake them: reordering); 0 = all")
	cmd.Flags().IntVar(&spinners, "spinners", 3, "starve: busy threads on the node's CPU")
	cmd.Flags().IntVar(&writeIOPS, "write-iops", raftlab.StallIOPS, "stall: the node's disk writes per second")
	addOutputFlag(cmd, &output)
	return cmd
}

func parseIDs(s string) ([]int, error) {
	var ids []int
	for _, p := range strings.Split(s, ",") {
		id, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || id < 1 {
			return nil, usagef("node list %q: use comma-separated node ids, e.g. 1,2", s)
		}
		ids = append(ids, id)
	}
	return ids, nil
}
