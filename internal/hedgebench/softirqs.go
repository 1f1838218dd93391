package hedgebench

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
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

// readSteal reads the time the hypervisor took from this machine's CPUs so far (/proc/stat's
// cpu line, its eighth field, steal, in USER_HZ ticks), summed over the CPUs. On a VM whose
// host runs other work, a run with steal in it ran on a slower machine than its neighbours.
func readSteal() (time.Duration, error) { return readStealFrom("/proc/stat") }

func readStealFrom(path string) (time.Duration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read steal: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, fmt.Errorf("read steal: %s: first line %q: want cpu and at least 8 fields", path, line)
	}
	ticks, err := strconv.ParseUint(f[8], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read steal: %s: %q: %w", path, f[8], err)
	}
	return time.Duration(ticks) * time.Second / 100, nil // USER_HZ is 100
}
