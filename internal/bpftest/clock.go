package bpftest

import (
	"fmt"

	"github.com/cilium/ebpf"
)

// ClockStart is where a fixed clock stands at the start of each case: far enough from 0
// that a program subtracting a few seconds from it (a deadline's age, a timeout) does not
// wrap.
const ClockStart uint64 = 1000e9

// FixClock makes the programs of spec read their time from the kedge_clock_ns variable
// instead of the kernel's clock (bpf/include/clock.h): call it before loading, then give the
// loaded object's variable to Runner.Clock. It fails when the object does not read the
// clock through clock.h.
func FixClock(spec *ebpf.CollectionSpec) error {
	v, ok := spec.Variables["kedge_clock_fixed"]
	if !ok {
		return fmt.Errorf("fix the clock: the object has no kedge_clock_fixed (include clock.h and read the time with kedge_now())")
	}
	if err := v.Set(true); err != nil {
		return fmt.Errorf("fix the clock: %w", err)
	}
	return nil
}
