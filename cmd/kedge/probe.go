package main

import (
	"fmt"

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
			r, err := probeRun(cmd.Context())
			if err != nil {
				return err
			}
			if err := writeReport(cmd.OutOrStdout(), output, r, r.WriteTable); err != nil {
				return err
			}
			return unsupported(r)
		},
	}
	addOutputFlag(cmd, &output)
	return cmd
}

// unsupported is nil when the report says kedge can run here, else the missing features
// (kedge.ErrNotSupported: exit 3).
func unsupported(r *probe.Report) error {
	if err := r.Err(); err != nil {
		return fmt.Errorf("this kernel cannot run kedge: %w", err)
	}
	return nil
}
