package probe

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteTable renders the report for people: one row per feature, then the delay-line
// backends and whether kedge can run here.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "kernel %s %s\n\n", r.Kernel.Release, r.Kernel.Machine)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "FEATURE\tAVAILABLE\tKEDGE USES IT FOR\tDETAIL")
	for _, f := range r.Features {
		avail := "no"
		switch {
		case !f.Probed:
			avail = "unknown"
		case f.Available:
			avail = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.Name, avail, f.UsedFor, f.Detail)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("render probe table: %w", err)
	}
	backends := r.DelayLineBackends()
	b.WriteString("\nhedging delay lines (preference edt > netem > conveyor): ")
	if len(backends) == 0 {
		b.WriteString("none\n")
	} else {
		b.WriteString(strings.Join(backends, ", ") + "\n")
	}
	if why := r.UnsupportedReason(); why != "" {
		fmt.Fprintf(&b, "kedge cannot run on this kernel: %s\n", why)
	} else if n := len(r.Incomplete()); n > 0 {
		fmt.Fprintf(&b, "%d features could not be probed; run 'kedge probe' as root for a full report\n", n)
	} else {
		b.WriteString("kedge can run on this kernel\n")
	}
	// tabwriter pads the last column too; trim trailing blanks so goldens stay clean.
	lines := strings.Split(b.String(), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " ")
	}
	_, err := io.WriteString(w, strings.Join(lines, "\n"))
	return err
}
