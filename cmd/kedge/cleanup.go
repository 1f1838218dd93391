package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/cleanup"
	"github.com/kedge-dev/kedge/internal/hedge"
)

func init() { register(newCleanupCmd) }

func newCleanupCmd() *cobra.Command {
	var (
		all, quiet     bool
		output, runDir string
	)
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Remove what killed kedge runs left behind (namespaces, tc filters, pins, status files)",
		Long: `Cleanup removes what kedge runs that were killed left behind, recognised by an
owner pid that no longer runs:
  - network namespaces named kedge-<pid>-...
  - cls_bpf filters named kedge:<pid>:... in the current network namespace
  - pin directories /sys/fs/bpf/kedge/<name>.<pid>
  - hedger status files /run/kedge/hedge.<pid>.json
With --all it also removes persistent labs made by 'kedge lab up'. Nothing of a
running kedge, and nothing without kedge's name on it, is ever touched.`,
		Example: `  # after a crash (make demo runs this first)
  sudo kedge cleanup

  # also remove every persistent lab
  sudo kedge cleanup --all

  # machine-readable list of what was removed
  sudo kedge cleanup -o json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutputFormat(output); err != nil {
				return err
			}
			if quiet && output == outputJSON {
				return usagef("--quiet and -o json exclude each other: drop one")
			}
			res, err := cleanup.Run(cleanup.Options{All: all, StatusDir: runDir})
			if !quiet {
				if werr := writeReport(cmd.OutOrStdout(), output, res, func(w io.Writer) error { return writeCleanup(w, res) }); werr != nil {
					err = errors.Join(err, werr)
				}
			}
			return rootHint(err)
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "also remove persistent labs made by 'kedge lab up'")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print nothing unless something fails")
	cmd.Flags().StringVar(&runDir, "run-dir", hedge.StatusDir, "directory of the hedgers' status files")
	_ = cmd.Flags().MarkHidden("run-dir")
	addOutputFlag(cmd, &output)
	return cmd
}

func writeCleanup(w io.Writer, r *cleanup.Result) error {
	if r.Count() == 0 {
		_, err := fmt.Fprintln(w, "nothing to clean up")
		return err
	}
	for _, g := range []struct {
		what  string
		items []string
	}{
		{"namespace", r.Namespaces}, {"tc", r.Filters}, {"pin dir", r.PinDirs}, {"status file", r.StatusFiles}, {"lab", r.Labs},
	} {
		for _, it := range g.items {
			if _, err := fmt.Fprintf(w, "removed %s %s\n", g.what, it); err != nil {
				return err
			}
		}
	}
	return nil
}

// rootHint adds "run as root" to permission errors of unprivileged callers.
func rootHint(err error) error {
	if err != nil && os.Geteuid() != 0 && (errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES)) {
		return fmt.Errorf("%w - kedge needs root for this: run it with sudo", err)
	}
	return err
}
