// Command kedge moves distributed-systems communication patterns (request hedging,
// latency monitoring, ...) into the Linux kernel with eBPF. See README.md.
//
// Exit codes: 0 success, 1 runtime error, 2 bad usage (flags, config), 3 this kernel cannot
// run kedge (see `kedge probe`).
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// Exit codes, documented in README.md and in `kedge --help`.
const (
	exitOK          = 0
	exitError       = 1
	exitUsage       = 2
	exitUnsupported = 3
)

// usageError marks errors caused by bad flags or configs (exit code 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// exitCodeError carries a specific exit code (e.g. exitUnsupported from probe).
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
		Long: `kedge moves communication patterns of distributed systems into the Linux kernel:
transparent UDP request hedging, passive latency monitoring, and the lab and
benchmarks that measure them. Run 'kedge probe' first to see what this kernel offers.`,
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
		return usageError{fmt.Errorf("%w (see '%s --help')", err, c.CommandPath())}
	})
	return cmd
}

func main() {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel})))
	for _, fn := range subcmdFns {
		rootCmd.AddCommand(fn())
	}
	os.Exit(run(rootCmd, os.Args[1:]))
}

// run executes the command tree and maps errors to exit codes.
func run(cmd *cobra.Command, args []string) int {
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
	var ue usageError
	var ce exitCodeError
	switch {
	case errors.As(err, &ce):
		return ce.code
	case errors.As(err, &ue):
		return exitUsage
	default:
		return exitError
	}
}
