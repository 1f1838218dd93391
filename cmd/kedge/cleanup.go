package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/spf13/cobra"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/kedge-dev/kedge/internal/cleanup"
	"github.com/kedge-dev/kedge/internal/runstate"
)

func init() { register(newCleanupCmd) }

func newCleanupCmd() *cobra.Command {
	var (
		all, quiet, dryRun bool
		output, runDir     string
	)
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Remove what ended kedge runs left behind (namespaces, tc filters, pins, status files)",
		Long: `Cleanup removes what kedge runs that ended without cleaning up (killed, crashed)
left behind. Everything kedge creates carries its run's owner ID (<pid>_<hex>):
  - network namespaces kedge-<owner>-...
  - cls_bpf filters kedge:<owner>:... in the current network namespace
  - pin directories /sys/fs/bpf/kedge/<name>.<owner>
  - status files /run/kedge/<capability>.<owner>.json
  - the pacer's veths (alias kedge:<owner>) here and in every named namespace
  - lab disks /var/tmp/kedge-disks/kedge-<owner>-....img (and a loop device on one)
  - disk-stall cgroups kedge-stall-<owner>-<pid> of the blkio (or io) hierarchy
A run holds a lock on its record /run/kedge/owners/<owner>.lock while it runs, so
cleanup knows for certain which runs have ended, also across PID namespaces
(containers): it removes only what belongs to those, and keeps what belongs to a
live run or to an owner it cannot judge (no record here), saying why. Names from
kedge versions before owner records carry a bare pid and are judged by the old rule
(no process of that pid in this PID namespace).

--dry-run removes nothing and lists what would go, and why. What cannot be removed
is reported with the reason, and cleanup exits 1; with --quiet it reports only that
(on stderr) and exits 0, so scripts (make demo) go on. With --all it also removes
persistent labs made by 'kedge lab up'.`,
		Example: `  # after a crash (make demo runs this first)
  sudo kedge cleanup

  # what would go, and why
  sudo kedge cleanup --dry-run

  # also remove every persistent lab
  sudo kedge cleanup --all

  # machine-readable: every leftover found, with the verdict on its owner
  sudo kedge cleanup -o json`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutputFormat(output); err != nil {
				return err
			}
			if quiet && output == outputJSON {
				return usagef("--quiet and -o json exclude each other: drop one")
			}
			res, err := cleanup.Run(cleanup.Options{All: all, DryRun: dryRun, StatusDir: runDir})
			failed := res.Failures()
			if quiet {
				// Report, never fail: what cannot be removed must not stop what comes next.
				for _, it := range failed {
					fmt.Fprintf(cmd.ErrOrStderr(), "kedge cleanup: cannot remove %s %s: %s\n", it.Kind, it.Name, it.Error)
				}
				if err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "kedge cleanup: %v\n", rootHint(err))
				}
				return nil
			}
			if werr := writeReport(cmd.OutOrStdout(), output, res, func(w io.Writer) error { return writeCleanup(w, res) }); werr != nil {
				err = errors.Join(err, werr)
			}
			if len(failed) > 0 {
				err = errors.Join(err, fmt.Errorf("%d leftover(s) could not be removed (reasons above)", len(failed)))
			}
			return rootHint(err)
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "also remove persistent labs made by 'kedge lab up'")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "remove nothing: list what would be removed, and why")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print only what cannot be removed (stderr), and exit 0")
	cmd.Flags().StringVar(&runDir, "run-dir", runstate.Dir, "directory of the status files")
	_ = cmd.Flags().MarkHidden("run-dir")
	addOutputFlag(cmd, &output)
	return cmd
}

func writeCleanup(w io.Writer, r *cleanup.Result) error {
	shown := 0
	for _, it := range r.Items {
		var err error
		switch {
		case it.Action == cleanup.Removed:
			_, err = fmt.Fprintf(w, "removed %s %s\n", it.Kind, it.Name) // why: -o json or --dry-run
		case it.Action == cleanup.WouldRemove:
			_, err = fmt.Fprintf(w, "would remove %s %s (%s)\n", it.Kind, it.Name, it.Reason)
		case it.Action == cleanup.Failed:
			_, err = fmt.Fprintf(w, "cannot remove %s %s: %s\n", it.Kind, it.Name, it.Error)
		case r.DryRun || it.State == runstate.Unknown.String():
			// A live run's things are listed on a dry run; an unjudgeable owner's always.
			_, err = fmt.Fprintf(w, "keep %s %s (%s)\n", it.Kind, it.Name, it.Reason)
		default:
			continue
		}
		if err != nil {
			return err
		}
		shown++
	}
	verb := "removed"
	if r.DryRun {
		verb = "would remove"
	}
	for _, l := range r.Labs {
		if _, err := fmt.Fprintf(w, "%s lab %s\n", verb, l); err != nil {
			return err
		}
		shown++
	}
	if len(r.Owners) > 0 {
		if _, err := fmt.Fprintf(w, "%s the records of %d ended run(s)\n", verb, len(r.Owners)); err != nil {
			return err
		}
		shown++
	}
	if shown == 0 {
		_, err := fmt.Fprintln(w, "nothing to clean up")
		return err
	}
	return nil
}

// cleanBeforeRun removes what killed runs left behind before a long-running command
// starts (cleanup.BeforeRun), logging what it removes and what stays.
func cleanBeforeRun(ns netns.NsHandle, statusDir string) {
	cleanup.BeforeRun(slog.Default(), ns, statusDir)
}

// rootHint adds "run as root" to permission errors of unprivileged callers.
func rootHint(err error) error {
	if err != nil && os.Geteuid() != 0 && (errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES)) {
		return fmt.Errorf("%w - kedge needs root for this: run it with sudo", err)
	}
	return err
}
