package hedgebench

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// readSoftirqs reads /proc/softirqs: the softirqs raised so far per kind (NET_RX, TIMER,
// HRTIMER, ...), summed over the CPUs. The rate scenario records them per run: the pacer's
// passes show as NET_RX (veth and the qdisc's dequeue) and HRTIMER (tbf's watchdog).
func readSoftirqs() (map[string]uint64, error) { return readSoftirqsFrom("/proc/softirqs") }

func readSoftirqsFrom(path string) (map[string]uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read softirqs: %w", err)
	}
	defer f.Close()
	out := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		kind, counts, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue // the header: CPU0 CPU1 ...
		}
		var sum uint64
		for _, c := range strings.Fields(counts) {
			v, err := strconv.ParseUint(c, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("read softirqs: %s: %s: %q: %w", path, strings.TrimSpace(kind), c, err)
			}
			sum += v
		}
		out[strings.TrimSpace(kind)] = sum
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read softirqs: %w", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("read softirqs: nothing in %s", path)
	}
	return out, nil
}
