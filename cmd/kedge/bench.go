package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/kedge-dev/kedge/internal/bench"
)

// How a capability adds a benchmark: a file cmd/kedge/bench_<name>.go (or the capability's
// own command file) calls registerBench from init() with the constructor of its
// `kedge bench <name>` command. The command takes --out (addBenchOutFlag), checks its
// flags (usage errors, exit 2) before requireBenchRoot, runs its driver (internal/<name>bench,
// built on internal/bench: Envelope, WriteJSON, the process and CPU harness), and prints
// the result's envelope line (writeEnvelope) and its table.

func init() { register(newBenchCmd) }

// benchCmds are the `kedge bench <name>` constructors registered by registerBench.
var benchCmds []func() *cobra.Command

// registerBench adds `kedge bench <name>`; call it from init().
func registerBench(fn func() *cobra.Command) { benchCmds = append(benchCmds, fn) }

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmarks that run in a kedge lab and write JSON results and charts",
		Long: `Each benchmark builds its own lab (network namespaces), runs real processes in it and
writes result.json under --out (default results/<name>/): the run's envelope (schema,
time, machine, kernel, commit, load average, parameters) and its measurements. Run
benchmarks one at a time on a quiet machine: the load average is recorded, not controlled.`,
	}
	for _, fn := range benchCmds {
		cmd.AddCommand(fn())
	}
	return cmd
}

// addBenchOutFlag adds --out, the directory results go to, default results/<name>.
func addBenchOutFlag(cmd *cobra.Command, p *string, name string) {
	cmd.Flags().StringVar(p, "out", filepath.Join("results", name), "directory for result.json and charts")
}

// requireBenchRoot refuses to run a benchmark without root, which every one needs (it
// creates network namespaces and loads BPF programs), before it builds anything. Like any
// command that lacks a privilege, it exits 1 (3 is for what the kernel lacks).
func requireBenchRoot(cmd *cobra.Command) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%s needs root (it creates network namespaces and loads BPF programs): run it with sudo", cmd.CommandPath())
	}
	return nil
}

// writeEnvelope prints where and when a result was measured.
func writeEnvelope(w io.Writer, what string, e bench.Envelope) {
	fmt.Fprintf(w, "%s: %s\n", what, e.Describe())
}
