package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/kedge-dev/kedge/internal/probe"
)

func init() { register(newProbeCmd) }

// probeRun is probe.Run; tests replace it to exercise reports this kernel would not give.
var probeRun = probe.Run

func newProbeCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "probe",
		Short: "Report what this kernel offers kedge (BPF features, attach modes, qdiscs)",
		Long: `Probe reports, for real, what the running kernel offers kedge: BTF, the BPF
syscall and JIT, the helpers kedge's programs call, TCX/clsact/XDP attach modes and
the qdiscs of the hedging delay lines. Helpers are probed by loading tiny programs;
attach modes and qdiscs by trying them on a veth pair inside a throw-away network
namespace (never in the current one). It also lists the delay-line backends this
kernel supports, best first (edt > netem > conveyor).

Without root only some features can be probed; the rest show as "unknown".

Exit codes: 0 kedge can run here, 1 probe failed, 3 kedge cannot run on this kernel
(no BPF syscall, no BTF, or neither TCX nor clsact); the reason is printed.`,
		Example: `  # table for people
  sudo kedge probe

  # the same as JSON, e.g. to pick a delay line in a script
  sudo kedge probe -o json | jq -r '.delay_line_backends[0]'`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutputFormat(output); err != nil {
				return err
			}
			r, err := probeRun(cmd.Context())
			if err != nil {
				return err
			}
			if err := writeReport(cmd.OutOrStdout(), output, r, r.WriteTable); err != nil {
				return err
			}
			if why := r.UnsupportedReason(); why != "" {
				return exitCodeError{exitUnsupported, fmt.Errorf("this kernel cannot run kedge: %s", why)}
			}
			return nil
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

// Output formats of -o.
const (
	outputTable = "table"
	outputJSON  = "json"
)

func addOutputFlag(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVarP(p, "output", "o", outputTable, "output format: table or json")
}

func checkOutputFormat(o string) error {
	if o != outputTable && o != outputJSON {
		return usagef("unknown output format %q: use -o table or -o json", o)
	}
	return nil
}

// writeReport prints v as indented JSON (-o json) or with table.
func writeReport(w io.Writer, output string, v any, table func(io.Writer) error) error {
	if output == outputJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(v); err != nil {
			return fmt.Errorf("encode json: %w", err)
		}
		return nil
	}
	return table(w)
}

// noArgs rejects positional arguments with a hint (cobra.NoArgs says only "unknown command").
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s takes no arguments, got %q (see '%s --help')", cmd.CommandPath(), args[0], cmd.CommandPath())
	}
	return nil
}
