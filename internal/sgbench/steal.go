package sgbench

import (
	"fmt"
	"io"
)

// StealFlagCPUs is the hypervisor steal above which a run is flagged in the text output: a
// tenth of a CPU (5% of this VM's two) taken by the host during the run's window means the
// run ran on a slower machine than its neighbours, and its figures compare badly with theirs.
const StealFlagCPUs = 0.1

// stealRun is one run's steal (CPUs over its window), named as the text output names it.
type stealRun struct {
	name string
	cpus float64
}

// stealMark is what a run's log line says of its steal.
func stealMark(cpus float64) string {
	if cpus > StealFlagCPUs {
		return fmt.Sprintf("steal %.2f CPUs: OVER %.2f", cpus, StealFlagCPUs)
	}
	return fmt.Sprintf("steal %.2f CPUs", cpus)
}

// writeStealRuns prints the runs whose steal exceeded StealFlagCPUs (or that none did) and
// the largest steal of any run.
func writeStealRuns(w io.Writer, runs []stealRun) {
	var over []stealRun
	most := 0.0
	for _, r := range runs {
		most = max(most, r.cpus)
		if r.cpus > StealFlagCPUs {
			over = append(over, r)
		}
	}
	fmt.Fprintf(w, "hypervisor steal: %d of %d runs over %.2f CPUs (largest %.2f)\n", len(over), len(runs), StealFlagCPUs, most)
	for _, r := range over {
		fmt.Fprintf(w, "  steal %.2f CPUs: %s\n", r.cpus, r.name)
	}
}
