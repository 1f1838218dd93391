// Command kedge moves distributed-systems communication patterns (request hedging, latency
// monitoring, scatter-gather, raft) into the Linux kernel with eBPF. See README.md.
//
// Exit codes (pkg/kedge.ExitCode): 0 success (status commands that find nothing running
// included), 1 runtime error, 2 bad usage (flags, arguments, config, a name - interface,
// namespace, lab, host, pid - that does not exist), 3 this kernel lacks a feature the
// command needs (see `kedge probe`).
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/spf13/cobra"

	"github.com/kedge-dev/kedge/internal/bpfx"
	"github.com/kedge-dev/kedge/internal/runstate"
	"github.com/kedge-dev/kedge/pkg/kedge"
)

// Exit codes, documented in README.md and in `kedge --help`.
const (
	exitOK          = kedge.ExitOK
	exitError       = kedge.ExitError
	exitUsage       = kedge.ExitUsage
	exitUnsupported = kedge.ExitUnsupported
)

// usageError marks errors caused by bad flags, arguments or configs (exit code 2).
type usageError = kedge.UsageError

func usagef(format string, args ...any) error {
	return usageError{Err: fmt.Errorf(format, args...)}
}

// exitCodeError carries a specific exit code (e.g. a child's exit status in 'lab exec').
type exitCodeError struct {
	code int
	err  error
}

func (e exitCodeError) Error() string { return e.err.Error() }
func (e exitCodeError) Unwrap() error { return e.err }

var (
	logLevel  = new(slog.LevelVar)
	verbose   bool
	rootCmd   = newRootCmd()
	subcmdFns []func() *cobra.Command
)

// register adds a subcommand constructor; each capability's file calls it from init().
func register(fn func() *cobra.Command) { subcmdFns = append(subcmdFns, fn) }

func newRootCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kedge",
		Short: "Kernel-resident communication patterns for distributed systems (eBPF)",
		Long: `kedge moves communication patterns of distributed systems into the Linux kernel
with eBPF, as one binary:

  hedge   transparent UDP request hedging: a request not answered within a delay is
          sent to another replica, the first response wins (unmodified clients)
  pping   passive latency monitoring: RTTs from the traffic itself (TCP timestamps,
          ICMP, DNS, UDP request ids), per flow or per subnet
  sg      scatter-gather: one datagram fanned out to up to 1024 workers, the replies
          reduced in XDP (also a Go API, pkg/sg)
  raft    a replicated key-value store on etcd's raft with its fast paths in XDP
  agent   hedgers and latency monitors from one config file, as a node service with
          Prometheus metrics (systemd unit, container image, Helm chart)

and the lab (network-namespace topologies), chaos and bench commands that measure them.
Run 'kedge probe' first to see what this kernel offers.

Exit codes, the same in every command: 0 success (a status or stats command that finds
nothing running says so and exits 0); 1 runtime error; 2 bad usage: a flag, argument or
config value that cannot be used, including a name that does not exist (an interface, a
namespace, a lab or host, a pid); 3 this kernel lacks a feature the command needs (the
message names it, the kernel version that has it and what to do).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRun: func(cmd *cobra.Command, args []string) {
			if verbose {
				logLevel.Set(slog.LevelDebug)
			}
		},
	}
	cmd.PersistentFlags().BoolVarP(&verbose, "verbose", "v", false, "debug logging (and full verifier logs on load errors)")
	cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageError{Err: fmt.Errorf("%w (see '%s --help')", err, c.CommandPath())}
	})
	return cmd
}

func main() {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel})))
	for _, fn := range subcmdFns {
		rootCmd.AddCommand(fn())
	}
	code := run(rootCmd, os.Args[1:])
	if code == exitOK {
		// Everything this run made is gone: its owner record goes too (a failed run keeps
		// it, so that what it could not remove is judged by the free lock, as after a kill).
		// Here, not in run: tests run commands in their own process, whose owner lives on.
		if err := runstate.CloseSelf(); err != nil {
			slog.Warn("remove this run's owner record", "err", err)
		}
	}
	os.Exit(code)
}

// run executes the command tree and maps errors to exit codes.
func run(cmd *cobra.Command, args []string) int {
	requireSubcommands(cmd)
	cmd.SetHelpCommand(newHelpCmd(cmd))
	cmd.SetArgs(args)
	// SIGINT/SIGTERM cancel the command's context, so long-running commands unwind through
	// their deferred cleanups (labs, hedgers, child processes) instead of dying mid-way.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := cmd.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(os.Stderr, "kedge: %v\n", err)
	return exitCode(err)
}

// exitCode maps an error to the exit code: an explicit exitCodeError, else pkg/kedge's
// model. cilium/ebpf's ErrNotSupported that no kedge package turned into a FeatureError
// still means "this kernel cannot", so it exits 3 too; an interface that does not exist
// (found missing deeper than the commands' own check) is bad usage.
func exitCode(err error) int {
	var ce exitCodeError
	switch {
	case errors.As(err, &ce):
		return ce.code
	case errors.Is(err, ebpf.ErrNotSupported):
		return exitUnsupported
	case errors.Is(err, bpfx.ErrNoInterface):
		return exitUsage
	default:
		return kedge.ExitCode(err)
	}
}

// requireSubcommands makes every command group (subcommands, no Run of its own) reject a
// missing or unknown subcommand as bad usage (exit 2) instead of cobra's defaults (an
// unknown command at the top exits 1, one further down prints help and exits 0). Groups
// that set Args themselves keep theirs; 'kedge' alone still prints the help.
func requireSubcommands(root *cobra.Command) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		if !c.HasSubCommands() || c.Runnable() || c.Args != nil {
			return
		}
		c.Args = func(c *cobra.Command, args []string) error {
			if len(args) == 0 {
				return nil
			}
			msg := fmt.Sprintf("unknown command %q for %q: use %s", args[0], c.CommandPath(), subcommandList(c))
			if s := c.SuggestionsFor(args[0]); len(s) > 0 {
				msg = fmt.Sprintf("unknown command %q for %q: did you mean %s?", args[0], c.CommandPath(), strings.Join(s, " or "))
			}
			return usagef("%s (see '%s --help')", msg, c.CommandPath())
		}
		c.RunE = func(c *cobra.Command, _ []string) error {
			if !c.HasParent() {
				return c.Help()
			}
			return usagef("%s needs a command: %s (see '%s --help')", c.CommandPath(), subcommandList(c), c.CommandPath())
		}
	}
	walk(root)
}

// newHelpCmd replaces cobra's help command, which prints the root help and exits 0 for a
// topic it does not know: here an unknown topic is bad usage (exit 2) with the list.
func newHelpCmd(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:   "help [command]",
		Short: "Help about any command",
		RunE: func(c *cobra.Command, args []string) error {
			target, rest, err := root.Find(args)
			if err != nil || len(rest) > 0 {
				parent := target
				if parent == nil {
					parent = root
				}
				return usagef("unknown help topic %q: use %s (see 'kedge --help')", strings.Join(args, " "), subcommandList(parent))
			}
			return target.Help()
		},
	}
}

// subcommandList is "a, b or c": the group's visible subcommands.
func subcommandList(c *cobra.Command) string {
	var names []string
	for _, sub := range c.Commands() {
		if sub.IsAvailableCommand() {
			names = append(names, sub.Name())
		}
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}
