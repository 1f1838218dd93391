package pping

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"
)

// The programs keep two clocks (bpf/include/clock.h): CLOCK_MONOTONIC in ns, read only when
// a packet stores an identifier or takes a sample, and jiffies (bpf_jiffies64), read for
// every measured packet (idle timestamps, the rate limit's first test). User space needs
// the tick length to convert and "now" in jiffies for the collector. The kernel's HZ is not
// exported, so it is measured once per process: a two-instruction program returns jiffies
// through BPF_PROG_TEST_RUN while the time between two ticks is taken; HZ is one of the
// values Kconfig allows (100, 250, 300, 1000).

// jiffyClock converts between CLOCK_MONOTONIC and jiffies.
type jiffyClock struct {
	tick  time.Duration // one jiffy
	refNs uint64        // a CLOCK_MONOTONIC time ...
	refJ  uint64        // ... and the jiffies at it
}

// jiffies estimates the jiffies at ns (within a tick or two: jiffies follow the
// timekeeping core's monotonic clock).
func (c jiffyClock) jiffies(ns uint64) uint64 {
	if ns < c.refNs {
		return c.refJ - (c.refNs-ns)/uint64(c.tick)
	}
	return c.refJ + (ns-c.refNs)/uint64(c.tick)
}

var hostJiffies struct {
	once  sync.Once
	clock jiffyClock
	err   error
}

// kernelJiffyClock measures the host's tick once per process.
func kernelJiffyClock() (jiffyClock, error) {
	hostJiffies.once.Do(func() { hostJiffies.clock, hostJiffies.err = measureJiffies() })
	return hostJiffies.clock, hostJiffies.err
}

// allowedHZ are the kernel's CONFIG_HZ choices.
var allowedHZ = []int{100, 250, 300, 1000}

// hzWindow is how long the tick is counted.
const hzWindow = 100 * time.Millisecond

func measureJiffies() (jiffyClock, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "pping_jiffies",
		Type: ebpf.SocketFilter,
		Instructions: asm.Instructions{
			asm.FnJiffies64.Call(), // r0 = jiffies; the retval is its low 32 bits
			asm.Return(),
		},
		License: "GPL",
	})
	if err != nil {
		return jiffyClock{}, fmt.Errorf("load the jiffies probe: %w (bpf_jiffies64 needs 5.5)", err)
	}
	defer prog.Close()
	read := func() (uint32, uint64, error) {
		ret, err := prog.Run(&ebpf.RunOptions{Data: make([]byte, 14)})
		if err != nil {
			return 0, 0, fmt.Errorf("run the jiffies probe: %w", err)
		}
		return ret, monoNs(), nil
	}
	// Ticks over a tenth of a second: 10, 25, 30 or 100 of them, give or take the one in
	// progress at either end, which keeps the four HZ values apart.
	j0, ns0, err := read()
	if err != nil {
		return jiffyClock{}, err
	}
	time.Sleep(hzWindow) // the window the ticks are counted over
	j1, ns1, err := read()
	if err != nil {
		return jiffyClock{}, err
	}
	measured := float64(j1-j0) / (float64(ns1-ns0) / 1e9)
	hz := allowedHZ[0]
	for _, h := range allowedHZ {
		if math.Abs(float64(h)-measured) < math.Abs(float64(hz)-measured) {
			hz = h
		}
	}
	// A reference pair: the 64-bit jiffies come from the probe's low 32 bits and the
	// kernel's INITIAL_JIFFIES (2^32 - 300 HZ, so the low half wraps five minutes after
	// boot) by the boot time of CLOCK_MONOTONIC: jiffies64 = INITIAL + monotonic/tick,
	// whose low 32 bits must equal the probe's.
	tick := time.Second / time.Duration(hz)
	lo, ns, err := read()
	if err != nil {
		return jiffyClock{}, err
	}
	initial := uint64(1<<32) - uint64(300*hz)
	est := initial + ns/uint64(tick)
	// Move est to the nearest value whose low 32 bits are lo.
	diff := int64(int32(lo - uint32(est)))
	return jiffyClock{tick: tick, refNs: ns, refJ: uint64(int64(est) + diff)}, nil
}

func monoNs() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}
